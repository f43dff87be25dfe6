// What the console needs from the Prometheus text at /metrics: histograms,
// summarised as count, mean and estimated quantiles (linear within a bucket,
// as Prometheus' histogram_quantile does).

/** Parse exposition text into [{name, labels, value}] samples. */
export function parseMetrics(text) {
  const samples = [];
  const line = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/;
  const label = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
  for (const raw of text.split("\n")) {
    if (!raw || raw.startsWith("#")) continue;
    const m = line.exec(raw);
    if (!m) continue;
    const labels = {};
    for (const [, key, value] of (m[2] ?? "").matchAll(label)) labels[key] = value.replace(/\\(.)/g, "$1");
    samples.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return samples;
}

function matches(labels, want) {
  return Object.entries(want).every(([k, v]) => labels[k] === v);
}

/** {count, sum, mean, p50, p90} of histogram `name` (samples whose labels include `want`, merged). */
export function histogram(samples, name, want = {}) {
  let count = 0;
  let sum = 0;
  const buckets = new Map();
  for (const s of samples) {
    if (!matches(s.labels, want)) continue;
    if (s.name === `${name}_count`) count += s.value;
    else if (s.name === `${name}_sum`) sum += s.value;
    else if (s.name === `${name}_bucket`) {
      const le = s.labels.le === "+Inf" ? Infinity : Number(s.labels.le);
      buckets.set(le, (buckets.get(le) ?? 0) + s.value);
    }
  }
  const sorted = [...buckets.entries()].sort((a, b) => a[0] - b[0]);
  const quantile = (q) => {
    if (!count) return null;
    const rank = q * count;
    let lower = 0;
    let below = 0;
    for (const [le, cumulative] of sorted) {
      if (cumulative >= rank) {
        if (le === Infinity) return lower;
        const inBucket = cumulative - below;
        return inBucket > 0 ? lower + ((le - lower) * (rank - below)) / inBucket : le;
      }
      lower = le;
      below = cumulative;
    }
    return lower;
  };
  return { count, sum, mean: count ? sum / count : null, p50: quantile(0.5), p90: quantile(0.9) };
}
