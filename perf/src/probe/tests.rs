use super::*;

#[test]
fn a_round_trip_takes_time_and_ends() {
    if thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        eprintln!("one CPU: no core-to-core round trip to measure");
        return;
    }
    let rt = core_round_trip(0, 1, Duration::from_millis(20)).unwrap();
    assert!(
        rt > Duration::ZERO && rt < Duration::from_millis(20),
        "{rt:?}"
    );
}

#[test]
fn a_cpu_that_does_not_exist_is_an_error() {
    assert!(matches!(
        core_round_trip(0, 100_000, Duration::from_millis(1)),
        Err(ProbeError::Pin(PinError { cpu: 100_000, .. }))
    ));
}
