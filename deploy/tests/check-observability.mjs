// Offline checks of the Prometheus rules and Grafana dashboards (tests/deploy/observability/prometheus_test.sh):
//   - every dashboard panel queries through the `datasource` variable;
//   - every PromQL expression (dashboards and rules) names only metrics the binaries export
//     (--metrics: one name per line, from the sources) or recording rules defined in --rules;
//   - writes every dashboard expression, Grafana variables substituted, as a rules file (--out) so
//     that `promtool check rules` parses each one.
// Usage: node check-observability.mjs --rules DIR --dashboards DIR --metrics FILE --out FILE
// Exit 0 when every check passes; 1 listing every failure.
import { readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { parse as parseYaml, stringify } from "yaml";

const args = {};
for (let i = 2; i < process.argv.length; i += 2) args[process.argv[i].replace(/^--/, "")] = process.argv[i + 1];
for (const k of ["rules", "dashboards", "metrics", "out"]) {
  if (!args[k]) {
    console.error(`check-observability: --${k} is required`);
    process.exit(2);
  }
}

const failures = [];
const exported = new Set(readFileSync(args.metrics, "utf8").split("\n").filter(Boolean));
// Prometheus' own series, and the suffixes a histogram's samples carry.
const builtin = new Set(["up", "scrape_duration_seconds", "scrape_samples_scraped", "vector", "scalar"]);

const recorded = new Set();
const ruleExprs = [];
for (const file of readdirSync(args.rules).filter((f) => f.endsWith(".yml"))) {
  for (const group of parseYaml(readFileSync(join(args.rules, file), "utf8")).groups) {
    for (const rule of group.rules) {
      if (rule.record) recorded.add(rule.record);
      ruleExprs.push({ where: `${file} ${rule.record ?? rule.alert}`, expr: rule.expr });
    }
  }
}

// Metric names of an expression: identifiers that are neither functions, keywords, label names
// inside {...} or by/without lists, nor strings.
const keywords = new Set(["by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset"]);
function metricNames(expr) {
  const stripped = expr
    .replace(/"(?:[^"\\]|\\.)*"/g, '""')
    .replace(/\{[^}]*\}/g, "{}")
    .replace(/\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)/g, "")
    .replace(/\[[^\]]*\]/g, "[]");
  const names = [];
  for (const m of stripped.matchAll(/[a-zA-Z_:][a-zA-Z0-9_:]*/g)) {
    const after = stripped.slice(m.index + m[0].length).trimStart();
    if (after.startsWith("(")) continue;  // a function call
    if (keywords.has(m[0]) || /^[0-9]/.test(m[0])) continue;
    if (/^(e|inf|nan)$/i.test(m[0])) continue;
    names.push(m[0]);
  }
  return names;
}
function known(name) {
  if (builtin.has(name) || recorded.has(name) || exported.has(name)) return true;
  const base = name.replace(/_(bucket|count|sum)$/, "");
  return exported.has(base);
}
function checkNames(where, expr) {
  for (const n of metricNames(expr)) if (!known(n)) failures.push(`${where}: '${n}' is neither exported by a binary nor recorded`);
}
for (const r of ruleExprs) checkNames(r.where, r.expr);

const generated = [];
for (const file of readdirSync(args.dashboards).filter((f) => f.endsWith(".json"))) {
  const dashboard = JSON.parse(readFileSync(join(args.dashboards, file), "utf8"));
  const vars = (dashboard.templating?.list ?? []).map((v) => v.name);
  if (!vars.includes("datasource")) failures.push(`${file}: no 'datasource' variable`);
  for (const panel of dashboard.panels ?? []) {
    if (panel.type === "row") continue;
    const where = `${file} panel '${panel.title}'`;
    if (panel.datasource?.uid !== "${datasource}") failures.push(`${where}: datasource is not \${datasource}`);
    if (!panel.targets?.length) failures.push(`${where}: no query`);
    for (const t of panel.targets ?? []) {
      if (t.datasource?.uid !== "${datasource}") failures.push(`${where} ${t.refId}: datasource is not \${datasource}`);
      const expr = t.expr
        .replaceAll("$__rate_interval", "1m")
        .replaceAll("$__range", "1h")
        .replaceAll("$__interval", "1m")
        .replace(/\$\{?(\w+)\}?/g, (_, v) => {
          if (!vars.includes(v)) failures.push(`${where}: undefined variable $${v}`);
          return ".*";
        });
      checkNames(where, expr);
      generated.push({ record: `dashboard:${file.replace(/\W/g, "_")}:panel${panel.id}_${t.refId}`, expr });
    }
  }
}
writeFileSync(args.out, stringify({ groups: [{ name: "dashboards", rules: generated }] }));

if (failures.length) {
  console.error(`check-observability: ${failures.length} failure(s):`);
  for (const f of failures) console.error(`  ${f}`);
  process.exit(1);
}
console.log(`check-observability: ${ruleExprs.length} rules and ${generated.length} dashboard queries name only exported or recorded metrics`);
