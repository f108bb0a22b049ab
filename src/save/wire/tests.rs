use super::*;
use crate::save::SaveScheduler;

fn step_of(scheduler: &mut SaveScheduler<String>, saving: &[&str]) -> SaveStep<String> {
    scheduler.record_step(saving.iter().map(|r| (r.to_string(), 1)))
}

fn report() -> WorkerReport<u64> {
    let mut latency = SaveLatency::default();
    latency.record(std::time::Duration::from_micros(3));
    latency.record(std::time::Duration::from_millis(20));
    latency.record(std::time::Duration::from_millis(20));
    let stats = SaveStats {
        steps: 3,
        recorded: 300,
        reported: u64::MAX,
        preemption_fences: 1,
        ..SaveStats::default()
    };
    WorkerReport::new(1, 2, vec![5, u64::MAX, 0], stats, latency)
}

#[test]
fn steps_round_trip_with_every_list() {
    let mut scheduler = SaveScheduler::new();
    step_of(&mut scheduler, &["a", "b"]);
    scheduler.preempt(&["b".to_string()]);
    assert!(scheduler.request_finished(&"a".to_string()));
    let step = step_of(&mut scheduler, &["b", "ü-ñ"]);
    let bytes = step.encode().unwrap();
    assert_eq!(SaveStep::<String>::decode(&bytes), Ok(step.clone()));
    assert_eq!(bytes[5], 1, "kind byte");
    assert_eq!(
        &bytes[6..10],
        &((bytes.len() - HEADER_LEN) as u32).to_le_bytes()
    );

    let numbers = SaveScheduler::new().record_step([(u64::MAX, 1), (0, 2)]);
    assert_eq!(
        SaveStep::<u64>::decode(&numbers.encode().unwrap()),
        Ok(numbers)
    );
    let raw = SaveScheduler::new().record_step([(vec![0u8, 255], 1), (Vec::new(), 1)]);
    assert_eq!(SaveStep::<Vec<u8>>::decode(&raw.encode().unwrap()), Ok(raw));
}

#[test]
fn an_empty_step_is_a_header_and_five_bytes() {
    let step = SaveScheduler::<u64>::new().record_step([]);
    let bytes = step.encode().unwrap();
    assert_eq!(
        bytes,
        [b'K', b'V', b'T', b'W', 1, 1, 5, 0, 0, 0, 0, 1, 0, 0, 0]
    );
}

#[test]
fn reports_round_trip_with_their_counters_and_latency() {
    let report = report();
    let bytes = report.encode().unwrap();
    let decoded = WorkerReport::<u64>::decode(&bytes).unwrap();
    assert_eq!(decoded, report);
    assert_eq!(decoded.latency.count(), 3);
    // encode_into appends: two messages in one buffer.
    let mut both = Vec::new();
    report.encode_into(&mut both).unwrap();
    report.encode_into(&mut both).unwrap();
    assert_eq!(both.len(), 2 * bytes.len());
}

#[test]
fn the_header_is_checked_field_by_field() {
    let bytes = SaveScheduler::<u64>::new()
        .record_step([(1, 1)])
        .encode()
        .unwrap();
    let with = |index: usize, value: u8| {
        let mut copy = bytes.clone();
        copy[index] = value;
        SaveStep::<u64>::decode(&copy)
    };
    assert_eq!(
        SaveStep::<u64>::decode(&bytes[..9]),
        Err(WireError::NoHeader { len: 9 })
    );
    assert!(matches!(with(0, b'X'), Err(WireError::BadMagic { .. })));
    assert_eq!(with(4, 2), Err(WireError::UnsupportedVersion { found: 2 }));
    assert_eq!(with(5, 9), Err(WireError::UnknownKind { found: 9 }));
    assert_eq!(
        with(5, 2),
        Err(WireError::WrongKind {
            expected: MessageKind::Step,
            found: MessageKind::Report
        })
    );
    assert_eq!(
        with(9, 0x10),
        Err(WireError::TooLong {
            declared: 0x1000_0000 + bytes.len() - HEADER_LEN
        })
    );
    assert!(matches!(
        SaveStep::<u64>::decode(&bytes[..bytes.len() - 1]),
        Err(WireError::LengthMismatch { .. })
    ));
}

#[test]
fn bodies_are_checked_to_the_last_byte() {
    let bytes = SaveScheduler::<u64>::new()
        .record_step([(1, 1)])
        .encode()
        .unwrap();
    // The id kind of another id type.
    assert_eq!(
        SaveStep::<String>::decode(&bytes),
        Err(WireError::IdKind {
            expected: IdKind::Utf8,
            found: 1
        })
    );
    // One byte more than the fields take, length adjusted.
    let mut longer = bytes.clone();
    longer.push(0);
    longer[6] += 1;
    assert_eq!(
        SaveStep::<u64>::decode(&longer),
        Err(WireError::TrailingBytes { at: bytes.len() })
    );
    // A list claiming more ids than the body holds.
    let mut short = bytes.clone();
    short[12] = 2;
    assert!(matches!(
        SaveStep::<u64>::decode(&short),
        Err(WireError::Truncated { at: 12, .. })
    ));
}

#[test]
fn a_report_refuses_what_no_encoder_writes() {
    let bytes = report().encode().unwrap();
    // Locate the histogram: it is the tail after the 16 counters. Rebuild
    // one with a bad bucket order by hand.
    let empty = WorkerReport::new(
        0,
        0,
        Vec::<u64>::new(),
        SaveStats::default(),
        SaveLatency::default(),
    )
    .encode()
    .unwrap();
    let histogram_at = empty.len() - 1;
    let with_histogram = |tail: &[u8]| {
        let mut copy = empty[..histogram_at].to_vec();
        copy.extend_from_slice(tail);
        let body = (copy.len() - HEADER_LEN) as u32;
        copy[6..10].copy_from_slice(&body.to_le_bytes());
        WorkerReport::<u64>::decode(&copy)
    };
    assert!(with_histogram(&[2, 3, 1, 4, 1]).is_ok());
    for (tail, field) in [
        (&[2, 4, 1, 3, 1][..], "bucket index"), // descending
        (&[2, 3, 1, 3, 1][..], "bucket index"), // repeated
        (&[1, 40, 1][..], "bucket index"),      // out of range
        (&[1, 3, 0][..], "bucket count"),       // an empty bucket written
        (&[41][..], "bucket count"),            // more buckets than exist
    ] {
        assert!(
            matches!(with_histogram(tail), Err(WireError::BadField { field: f, .. }) if f == field),
            "{tail:?}: {:?}",
            with_histogram(tail)
        );
    }
    // A counter count of another version.
    let mut counters = empty.clone();
    counters[HEADER_LEN + 4] = 17;
    assert!(matches!(
        WorkerReport::<u64>::decode(&counters),
        Err(WireError::BadField {
            field: "counter count",
            ..
        })
    ));
    // A worker index beyond u32.
    let mut wide = empty[..HEADER_LEN].to_vec();
    put_varint(&mut wide, u64::from(u32::MAX) + 1);
    wide.extend_from_slice(&empty[HEADER_LEN + 1..]);
    let body = (wide.len() - HEADER_LEN) as u32;
    wide[6..10].copy_from_slice(&body.to_le_bytes());
    assert!(matches!(
        WorkerReport::<u64>::decode(&wide),
        Err(WireError::BadField {
            field: "worker",
            ..
        })
    ));
    assert!(WorkerReport::<u64>::decode(&bytes).is_ok());
}

#[test]
fn read_message_frames_a_stream_and_tells_a_clean_end_from_a_cut() {
    let mut scheduler = SaveScheduler::<u64>::new();
    let mut stream = Vec::new();
    for saving in [1, 2, 3] {
        scheduler
            .record_step([(saving, 1)])
            .encode_into(&mut stream)
            .unwrap();
    }
    report().encode_into(&mut stream).unwrap();
    let mut reader = &stream[..];
    let mut message = Vec::new();
    for expected in 0..3 {
        assert_eq!(
            read_message(&mut reader, &mut message).unwrap(),
            Some(MessageKind::Step)
        );
        assert_eq!(SaveStep::<u64>::decode(&message).unwrap().step(), expected);
    }
    assert_eq!(
        read_message(&mut reader, &mut message).unwrap(),
        Some(MessageKind::Report)
    );
    assert_eq!(WorkerReport::<u64>::decode(&message).unwrap(), report());
    assert!(read_message(&mut reader, &mut message).unwrap().is_none());

    for cut in [3, HEADER_LEN + 2] {
        let mut reader = &stream[..cut];
        match read_message(&mut reader, &mut message) {
            Err(ReadError::Io(error)) => assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof),
            other => panic!("cut at {cut}: {other:?}"),
        }
    }
    let mut huge = stream[..HEADER_LEN].to_vec();
    huge[6..10].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        read_message(&mut &huge[..], &mut message),
        Err(ReadError::Wire(WireError::TooLong { .. }))
    ));
}

#[test]
fn errors_say_where_and_what() {
    assert_eq!(
        WireError::Truncated { at: 12, needed: 8 }.to_string(),
        "a field at byte 12 needs 8 more bytes than the message has"
    );
    assert_eq!(
        WireError::UnsupportedVersion { found: 2 }.to_string(),
        "message version 2, but this build reads version 1 only"
    );
}

#[test]
fn a_message_over_the_limit_is_refused_and_leaves_the_buffer_as_it_was() {
    // 64 ids of 1 MiB: the body is a few bytes over MAX_BODY.
    let step = SaveScheduler::new().record_step((0..64u8).map(|i| {
        let mut id = vec![0u8; 1 << 20];
        id[0] = i;
        (id, 1)
    }));
    let mut out = b"kept".to_vec();
    assert!(matches!(
        step.encode_into(&mut out),
        Err(WireError::TooLong { declared }) if declared > MAX_BODY
    ));
    assert_eq!(out, b"kept");
}
