//! Small helpers for the command's reports.

use std::io::Write;
use std::time::Duration;

use super::failure::Failure;

/// Writes one line to stdout (see the `say!` macro).
pub(crate) fn line(text: std::fmt::Arguments<'_>) -> Result<(), Failure> {
    let mut stdout = std::io::stdout().lock();
    match writeln!(stdout, "{text}") {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => {
            Err(Failure::closed_stdout())
        }
        Err(error) => Err(Failure::run(format!("cannot write to stdout: {error}"))),
    }
}

/// The `q`-quantile (0 ≤ q ≤ 1) of `samples` by nearest rank; `None` when
/// there are none. Sorts `samples`.
pub(crate) fn quantile(samples: &mut [Duration], q: f64) -> Option<Duration> {
    if samples.is_empty() {
        return None;
    }
    samples.sort_unstable();
    let rank = (q * samples.len() as f64).ceil() as usize;
    Some(samples[rank.clamp(1, samples.len()) - 1])
}

/// Milliseconds with two decimals.
pub(crate) fn ms(duration: Duration) -> f64 {
    (duration.as_secs_f64() * 100_000.0).round() / 100.0
}

/// `ms` of an optional duration, or a dash.
pub(crate) fn ms_or_dash(duration: Option<Duration>) -> String {
    duration.map_or_else(|| "-".to_owned(), |d| format!("{:.2} ms", ms(d)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let mut samples: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        assert_eq!(quantile(&mut samples, 0.5), Some(Duration::from_millis(50)));
        assert_eq!(
            quantile(&mut samples, 0.99),
            Some(Duration::from_millis(99))
        );
        assert_eq!(
            quantile(&mut samples, 1.0),
            Some(Duration::from_millis(100))
        );
        assert_eq!(quantile(&mut samples, 0.0), Some(Duration::from_millis(1)));
        assert_eq!(quantile(&mut [], 0.5), None);
        assert_eq!(ms(Duration::from_micros(1234)), 1.23);
    }
}
