//! Communicators, collectives and parallel training (filled by the parallel issue).
