//! How the outbox bench takes a rate: work split over tasks, timed, and the median of
//! the rounds (the saga, relay and agents benches take their medians here too).

use std::future::Future;
use std::time::Instant;

use tokio::task::JoinSet;

pub(crate) fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    match xs.len() {
        0 => 0.0,
        n if n % 2 == 1 => xs[n / 2],
        n => (xs[n / 2 - 1] + xs[n / 2]) / 2.0,
    }
}

/// Runs `units` units of work split over `tasks` tasks; `work(task, count)` does
/// `count` units, numbering them `task, task + tasks, …`. Returns units × `per_unit`
/// per second.
pub(super) async fn parallel<F, Fut>(
    tasks: usize,
    units: usize,
    per_unit: usize,
    work: F,
) -> anyhow::Result<f64>
where
    F: Fn(usize, usize) -> Fut,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let start = Instant::now();
    let mut set = JoinSet::new();
    for t in 0..tasks {
        let count = units / tasks + usize::from(t < units % tasks);
        set.spawn(work(t, count));
    }
    while let Some(done) = set.join_next().await {
        done??;
    }
    Ok((units * per_unit) as f64 / start.elapsed().as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(vec![]), 0.0);
    }
}
