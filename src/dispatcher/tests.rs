//! The dispatcher's decisions as a user sees them: a [`World`] built by hand, its plans carried
//! out the way an executor carries them out (each outcome reported to [`apply`], copies
//! appear in and vanish from the workers and the world hears of it), and the outcome checked
//! after each step: where Jobs run, what their conditions say, what quota they hold.

mod admission;
mod lifecycle;
mod random;
mod starvation;
mod support;
mod workers;
