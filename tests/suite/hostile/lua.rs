//! Lua that tries to escape its budget: `__close` handlers, C-level pattern matching on huge
//! subjects, hooks that never return.
