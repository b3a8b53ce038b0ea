// A Prometheus HTTP API client for the deploy tests:
//   node promql.mjs wait  URL QUERY [TIMEOUT_S]   poll until QUERY returns a sample (exit 1 after)
//   node promql.mjs query URL QUERY               print each sample: '{labels} value'
//   node promql.mjs metrics ADDRESS               print a /metrics page (for promtool check metrics)
const [cmd, url, query, timeoutS] = process.argv.slice(2);
if (!cmd || !url || (cmd !== "metrics" && !query)) {
  console.error("usage: node promql.mjs wait|query URL QUERY [TIMEOUT_S] | metrics ADDRESS");
  process.exit(2);
}

async function instant(q) {
  const r = await fetch(`${url}/api/v1/query?query=${encodeURIComponent(q)}`);
  const body = await r.json();
  if (body.status !== "success") throw new Error(`${q}: ${body.errorType}: ${body.error}`);
  const data = body.data;
  if (data.resultType === "scalar") return [{ metric: {}, value: data.result }];
  return data.result;
}
const format = (s) => {
  const labels = Object.entries(s.metric).map(([k, v]) => `${k}="${v}"`).sort().join(",");
  return `{${labels}} ${s.value[1]}`;
};

try {
  if (cmd === "metrics") {
    const r = await fetch(`http://${url}/metrics`);
    if (!r.ok) throw new Error(`http://${url}/metrics: HTTP ${r.status}`);
    process.stdout.write(await r.text());
  } else if (cmd === "query") {
    for (const s of await instant(query)) console.log(format(s));
  } else if (cmd === "wait") {
    const deadline = Date.now() + 1000 * Number(timeoutS ?? 60);
    for (;;) {
      let samples = [];
      let last = "";
      try {
        samples = await instant(query);
      } catch (e) {
        // Not up or not ready yet (refused, 503 before the TSDB is open, a half-read answer): retry.
        last = `: last error ${e.cause?.code ?? e.message}`;
      }
      if (samples.length) break;
      if (Date.now() > deadline) {
        console.error(`promql: no sample of '${query}' after ${timeoutS ?? 60} s${last}`);
        process.exit(1);
      }
      await new Promise((r) => setTimeout(r, 250));
    }
  } else {
    console.error(`promql: unknown command ${cmd}`);
    process.exit(2);
  }
} catch (e) {
  console.error(`promql: ${e.message}`);
  process.exit(1);
}
