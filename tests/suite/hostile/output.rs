//! A guest that floods output: the host keeps a bounded head and tail per stream, the whole
//! output stays in the guest, and every command has a timeout and the run's cancellation.
