//! Metrics read back: sums, breakdowns and quantiles of what was gathered at one moment.

use prometheus::proto::MetricFamily;

/// Metrics as gathered at one moment.
pub struct Snapshot(pub(super) Vec<MetricFamily>);

impl Snapshot {
    /// The sum of every series of `name` (a Prometheus name, e.g. `larder_requests_total`)
    /// whose labels include all of `labels`. Histograms sum their counts.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let Some(family) = self.0.iter().find(|f| f.name() == name) else {
            return 0.0;
        };
        family
            .get_metric()
            .iter()
            .filter(|m| {
                labels.iter().all(|(k, v)| {
                    m.get_label()
                        .iter()
                        .any(|l| l.name() == *k && l.value() == *v)
                })
            })
            .map(|m| value_of(family, m))
            .sum()
    }

    /// The sums of every series of `name`, by the value of their label `key`.
    pub fn sum_by(&self, name: &str, key: &str) -> std::collections::BTreeMap<String, f64> {
        let mut out = std::collections::BTreeMap::new();
        let Some(family) = self.0.iter().find(|f| f.name() == name) else {
            return out;
        };
        for m in family.get_metric() {
            let Some(label) = m.get_label().iter().find(|l| l.name() == key) else {
                continue;
            };
            *out.entry(label.value().to_owned()).or_insert(0.0) += value_of(family, m);
        }
        out
    }

    /// The `q` quantile (0..1) of histogram `name`, estimated from its buckets as Prometheus'
    /// `histogram_quantile` does; `None` without observations.
    pub fn quantile(&self, name: &str, q: f64) -> Option<f64> {
        let family = self.0.iter().find(|f| f.name() == name)?;
        let mut bounds: Vec<(f64, u64)> = Vec::new();
        for m in family.get_metric() {
            for (i, b) in m.get_histogram().get_bucket().iter().enumerate() {
                match bounds.get_mut(i) {
                    Some(slot) => slot.1 += b.cumulative_count(),
                    None => bounds.push((b.upper_bound(), b.cumulative_count())),
                }
            }
        }
        let total = bounds.last().map(|b| b.1)?;
        if total == 0 {
            return None;
        }
        let rank = q * total as f64;
        let mut lower = (0.0, 0u64);
        for (bound, count) in bounds {
            if count as f64 >= rank {
                let in_bucket = (count - lower.1) as f64;
                let frac = if in_bucket > 0.0 {
                    (rank - lower.1 as f64) / in_bucket
                } else {
                    0.0
                };
                return Some(lower.0 + (bound - lower.0) * frac);
            }
            lower = (bound, count);
        }
        Some(lower.0)
    }
}

fn value_of(family: &MetricFamily, m: &prometheus::proto::Metric) -> f64 {
    use prometheus::proto::MetricType as T;
    match family.get_field_type() {
        T::COUNTER => m.get_counter().get_value(),
        T::GAUGE => m.get_gauge().get_value(),
        T::HISTOGRAM => m.get_histogram().get_sample_count() as f64,
        _ => 0.0,
    }
}
