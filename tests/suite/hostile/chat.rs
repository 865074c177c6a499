//! Hostile chat users: bot loops, commands for other bots, names and texts made to fool a
//! terminal or the model, pairing starvation, oversized media.
