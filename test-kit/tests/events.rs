//! `Events` counts on its own thread even when the counted callsite is first reached on another
//! thread that has no subscriber (the order that cost CI a run: a receiver of another test
//! decided first, and the counting test then saw 0 of 6 decisions).
#![cfg(feature = "events")]

use test_kit::events::Events;

fn decide() {
    tracing::trace!(target: "test_kit::probe", "decided");
}

#[test]
fn a_callsite_first_reached_on_another_thread_is_still_counted_here() {
    let events = Events::count("test_kit::probe");
    // Another thread, no subscriber of its own, reaches the callsite first and registers it.
    std::thread::spawn(decide).join().unwrap();
    decide();
    decide();
    assert_eq!(events.take(), 2, "both events on this thread counted");
}
