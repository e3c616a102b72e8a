//! The dtx coordinator.
