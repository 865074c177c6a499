//! A guest writing hostile files into `workspace/`: deep YAML, huge files, FIFOs, symlinks to
//! host files or devices, a HEARTBEAT.yml rewritten in a loop.
