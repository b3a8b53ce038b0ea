// Offline checks of rendered Kubernetes manifests (tests/deploy/manifests_test.sh runs it on each
// overlay's `kubectl kustomize` output):
//   1. every object validates against the Kubernetes OpenAPI schema (npm kubernetes-models);
//   2. project checks: images tagged (never `latest`) and built by deploy/docker/Dockerfile with
//      the ports the containers declare; every probe's port is a container port; every Service's
//      and NetworkPolicy's port names exist in the pods they select; every flag a container passes
//      is one its binary accepts (the binary's --help); every file a container is pointed at
//      exists (a ConfigMap key, or a file the image copies); the grace period covers the preStop
//      sleep and the drain; the shard addresses in the node config are the shard StatefulSet's;
//   3. writes every ConfigMap's files to --out/<configmap>/ so the caller can run the binaries'
//      own --check-config on them.
// Usage: node check-manifests.mjs --rendered FILE --dockerfile FILE --out DIR
//        [--binary IMAGE=PATH ...]   (IMAGE: hlem/router ...; PATH: the built binary)
// Exit 0 when every check passes; 1 listing every failure.
import { execFileSync } from "node:child_process";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { basename, dirname, join, posix } from "node:path";
import { parseAllDocuments, parse as parseYaml } from "yaml";

const args = { binary: [] };
for (let i = 2; i < process.argv.length; i += 2) {
  const key = process.argv[i].replace(/^--/, "");
  const value = process.argv[i + 1];
  if (value === undefined) usage(`${process.argv[i]} needs a value`);
  if (key === "binary") args.binary.push(value);
  else if (["rendered", "dockerfile", "out"].includes(key)) args[key] = value;
  else usage(`unknown flag ${process.argv[i]}`);
}
for (const k of ["rendered", "dockerfile", "out"]) if (!args[k]) usage(`--${k} is required`);

function usage(message) {
  console.error(`check-manifests: ${message}`);
  console.error("usage: node check-manifests.mjs --rendered FILE --dockerfile FILE --out DIR [--binary IMAGE=PATH ...]");
  process.exit(2);
}

const failures = [];
const fail = (where, message) => failures.push(`${where}: ${message}`);

const docs = parseAllDocuments(readFileSync(args.rendered, "utf8"))
  .map((d) => d.toJS())
  .filter((d) => d);
const name = (o) => `${o.kind}/${o.metadata?.name}`;

// ---- 1. schema ----------------------------------------------------------------------------
for (const o of docs) {
  if (!o.apiVersion || !o.kind) {
    fail("object", `without apiVersion/kind: ${JSON.stringify(o).slice(0, 80)}`);
    continue;
  }
  const [group, version] = o.apiVersion.includes("/") ? o.apiVersion.split("/") : [null, o.apiVersion];
  const module = `kubernetes-models/${group ? `${group}/` : ""}${version}/${o.kind}`;
  let Model;
  try {
    Model = (await import(module))[o.kind];
  } catch (e) {
    fail(name(o), `no schema for ${o.apiVersion} ${o.kind} (${e.code ?? e.message})`);
    continue;
  }
  try {
    new Model(o).validate();
  } catch (e) {
    fail(name(o), `schema: ${e.message}`);
  }
}

// ---- the Dockerfile's targets: ENTRYPOINT, EXPOSE, COPY destinations --------------------------
const targets = {};
{
  let current = null;
  const lines = readFileSync(args.dockerfile, "utf8").replace(/\\\n/g, " ").split("\n");
  for (const line of lines) {
    const from = line.match(/^FROM\s+(\S+)(?:\s+AS\s+(\S+))?/i);
    if (from) {
      const base = targets[from[1]];
      current = from[2] ?? null;
      if (current) {
        targets[current] = {
          image: from[1],
          expose: new Set(base ? base.expose : []),
          files: new Set(base ? base.files : []),
          entrypoint: base?.entrypoint ?? null,
        };
        if (from[1].includes(":latest") || (!from[1].includes(":") && !base && !from[1].startsWith("$"))) {
          fail("Dockerfile", `FROM ${from[1]}: pin a tag`);
        }
      }
      continue;
    }
    if (!current) continue;
    const t = targets[current];
    const expose = line.match(/^EXPOSE\s+(.*)/i);
    if (expose) for (const p of expose[1].trim().split(/\s+/)) t.expose.add(Number(p));
    const entry = line.match(/^ENTRYPOINT\s+(\[.*\])/i);
    if (entry) t.entrypoint = JSON.parse(entry[1])[0];
    const copy = line.match(/^COPY\s+(?:--\S+\s+)*(.+)$/i);
    if (copy) {
      const parts = copy[1].trim().split(/\s+/);
      const dest = parts.pop();
      for (const src of parts) {
        t.files.add(dest.endsWith("/") ? posix.join(dest, basename(src)) : dest);
        t.files.add(dest.replace(/\/$/, ""));
      }
    }
  }
}

// ---- 2. project checks ----------------------------------------------------------------------
const configMaps = Object.fromEntries(docs.filter((o) => o.kind === "ConfigMap").map((o) => [o.metadata.name, o]));
const workloads = docs.filter((o) => ["Deployment", "StatefulSet", "DaemonSet", "Job"].includes(o.kind));
const binaries = Object.fromEntries(args.binary.map((b) => b.split("=")));
const helpCache = {};
function flagsOf(image) {
  const path = binaries[image];
  if (!path) return null;
  if (!helpCache[path]) {
    const help = execFileSync(path, ["--help"], { encoding: "utf8" });
    helpCache[path] = new Set([...help.matchAll(/(?:^|[\s,])(--[a-z][a-z0-9-]*)/g)].map((m) => m[1]));
  }
  return helpCache[path];
}
const matches = (selector, labels) =>
  Object.entries(selector ?? {}).every(([k, v]) => labels?.[k] === v);
const podsSelectedBy = (selector) =>
  workloads.filter((w) => matches(selector, w.spec.template.metadata?.labels));
const containerPorts = (w) => w.spec.template.spec.containers.flatMap((c) => c.ports ?? []);
const portExists = (ports, port) =>
  ports.some((p) => (typeof port === "number" ? p.containerPort === port : p.name === port));
const flagValue = (c, flag) => {
  for (const a of c.args ?? []) if (a.startsWith(`${flag}=`)) return a.slice(flag.length + 1);
  return undefined;
};

// The node config's shard addresses must be the shard StatefulSet's pods.
function checkShardAddresses(where, nodeYaml, shardsYaml, configMap) {
  const shardSet = workloads.find((w) => w.kind === "StatefulSet" && w.metadata.name === "embedding-shard");
  if (!shardSet) return fail(where, "no embedding-shard StatefulSet for the node config's shards");
  const shards = parseYaml(configMap.data[shardsYaml]);
  const servers = parseYaml(configMap.data[nodeYaml]).shards?.servers ?? [];
  const n = shards.shard_map?.num_shards ?? 1;
  if ((shardSet.spec.replicas ?? 1) !== n) {
    fail(where, `embedding-shard has ${shardSet.spec.replicas} replicas, ${shardsYaml} has num_shards ${n}`);
  }
  const grpc = containerPorts(shardSet).find((p) => p.name === "grpc")?.containerPort;
  servers.forEach((s, i) => {
    const want = `${shardSet.metadata.name}-${i}.${shardSet.spec.serviceName}:${grpc}`;
    if (s !== want) fail(where, `${nodeYaml} shards.servers[${i}] is ${s}, the StatefulSet's pod is ${want}`);
  });
}

for (const w of workloads) {
  const spec = w.spec.template.spec;
  for (const c of spec.containers) {
    const where = `${name(w)} container ${c.name}`;
    const [repo, tag] = c.image.split(":");
    if (!tag || tag === "latest") fail(where, `image ${c.image}: pin a tag (never latest)`);
    const target = targets[repo.replace(/^.*\//, "")];
    if (repo.startsWith("hlem/") && !target) fail(where, `image ${repo}: no Dockerfile target ${repo.slice(5)}`);
    const ports = c.ports ?? [];
    for (const p of ports) {
      if (target && !target.expose.has(p.containerPort)) {
        fail(where, `port ${p.name} ${p.containerPort} is not EXPOSEd by the image's Dockerfile target`);
      }
    }
    for (const kind of ["startupProbe", "readinessProbe", "livenessProbe"]) {
      const probe = c[kind];
      if (!probe) continue;
      const port = probe.grpc?.port ?? probe.httpGet?.port ?? probe.tcpSocket?.port;
      if (!portExists(ports, port)) fail(where, `${kind} port ${port} is not a container port`);
    }
    // Flags: the binary's --help lists every one it accepts.
    const flags = flagsOf(repo);
    if (flags) {
      for (const a of c.args ?? []) {
        const flag = a.split("=")[0];
        if (flag.startsWith("--") && !flags.has(flag)) fail(where, `${flag}: the binary has no such flag`);
      }
    } else if (repo.startsWith("hlem/") && args.binary.length) {
      fail(where, `no --binary given for ${repo}`);
    }
    // Listen addresses name declared ports.
    for (const [flag, portName] of [["--listen", "grpc"], ["--admin-listen", "admin"], ["--health-listen", "health"], ["--metrics-listen", "metrics"]]) {
      const value = flagValue(c, flag);
      if (value === undefined) continue;
      const port = Number(value.split(":").pop());
      const declared = ports.find((p) => p.name === portName);
      if (!declared || declared.containerPort !== port) fail(where, `${flag}=${value} but container port ${portName} is ${declared?.containerPort}`);
    }
    // Files the container is pointed at: a ConfigMap key under a mount, or a file of the image.
    for (const a of c.args ?? []) {
      const m = a.match(/^--(config|weights|tls-cert|tls-key|tls-ca|admin-token-file|frontend-token-file)=(\/.+)$/);
      if (!m) continue;
      const path = m[2];
      const mount = (c.volumeMounts ?? []).find((vm) => path.startsWith(`${vm.mountPath}/`));
      if (!mount) {
        if (!target?.files.has(path)) fail(where, `${a}: neither under a volume mount nor copied into the image`);
        continue;
      }
      const volume = (spec.volumes ?? []).find((v) => v.name === mount.name);
      if (volume?.secret?.items && !volume.secret.items.some((i) => i.path === path.slice(mount.mountPath.length + 1))) {
        fail(where, `${a}: Secret volume ${mount.name} does not project that key`);
      }
      if (!volume?.configMap) continue;  // a data or Secret volume: not knowable offline
      const cm = configMaps[volume.configMap.name];
      const key = path.slice(mount.mountPath.length + 1);
      if (!cm) fail(where, `volume ${mount.name}: ConfigMap ${volume.configMap.name} is not in the manifests`);
      else if (!(key in (cm.data ?? {}))) fail(where, `${a}: ConfigMap ${cm.metadata.name} has no key ${key}`);
      else if (m[1] === "config") {
        const config = parseYaml(cm.data[key]);
        const relative = config?.shards?.config;  // the node config names the shard config file
        if (relative) {
          if (!(relative in cm.data)) fail(where, `${key} refers to ${relative}, not in ConfigMap ${cm.metadata.name}`);
          else checkShardAddresses(`${where} ${key}`, key, relative, cm);
        }
      }
    }
    // Grace period ≥ preStop sleep + drain + 1 s.
    const sleep = Number(c.lifecycle?.preStop?.exec?.command?.[0] === "sleep" ? c.lifecycle.preStop.exec.command[1] : 0);
    const drain = Number(flagValue(c, "--drain-timeout") ?? 10);
    const grace = spec.terminationGracePeriodSeconds ?? 30;
    if (grace < sleep + drain + 1) fail(where, `terminationGracePeriodSeconds ${grace} < preStop ${sleep} s + drain ${drain} s + 1 s`);
  }
}

// The routers count SLO attainment against the SLO the nodes are configured with.
for (const w of workloads) {
  for (const c of w.spec.template.spec.containers) {
    if (!c.image.startsWith("hlem/router:")) continue;
    const routerSlo = Number(flagValue(c, "--slo-ms") ?? 25);  // the router's default
    for (const cm of Object.values(configMaps)) {
      for (const [key, text] of Object.entries(cm.data ?? {})) {
        if (!key.endsWith(".yaml")) continue;
        const slo = parseYaml(text)?.node?.slo;
        const m = typeof slo === "string" && slo.match(/^([0-9.]+)ms$/);
        if (m && Number(m[1]) !== routerSlo) {
          fail(`${name(w)} container ${c.name}`, `--slo-ms ${routerSlo} but ${cm.metadata.name} ${key} has node.slo ${slo}`);
        }
      }
    }
  }
}

for (const s of docs.filter((o) => o.kind === "Service")) {
  const pods = podsSelectedBy(s.spec.selector);
  if (!pods.length) fail(name(s), "selects no workload");
  for (const p of s.spec.ports ?? []) {
    const target = p.targetPort ?? p.port;
    for (const w of pods) if (!portExists(containerPorts(w), target)) fail(name(s), `targetPort ${target} is not a port of ${name(w)}`);
  }
}
for (const np of docs.filter((o) => o.kind === "NetworkPolicy")) {
  const pods = podsSelectedBy(np.spec.podSelector?.matchLabels);
  if (!pods.length) fail(name(np), "selects no workload");
  for (const rule of np.spec.ingress ?? []) {
    for (const p of rule.ports ?? []) {
      for (const w of pods) if (!portExists(containerPorts(w), p.port)) fail(name(np), `port ${p.port} is not a port of ${name(w)}`);
    }
  }
  // A port named admin must never be open to everyone (a rule without `from`).
  for (const w of pods) {
    if (!portExists(containerPorts(w), "admin")) continue;
    for (const rule of np.spec.ingress ?? []) {
      if (!rule.from && (!rule.ports || rule.ports.some((p) => p.port === "admin"))) fail(name(np), "opens the admin port to every source");
    }
  }
}
for (const w of workloads) {
  if (!containerPorts(w).some((p) => p.name === "admin")) continue;
  const covered = docs.some((o) => o.kind === "NetworkPolicy" && matches(o.spec.podSelector?.matchLabels, w.spec.template.metadata?.labels));
  if (!covered) fail(name(w), "has an admin port but no NetworkPolicy restricts it");
}
for (const kind of ["PodDisruptionBudget"]) {
  for (const w of workloads.filter((x) => (x.spec.replicas ?? 1) > 1)) {
    const has = docs.some((o) => o.kind === kind && matches(o.spec.selector?.matchLabels, w.spec.template.metadata?.labels));
    if (!has) fail(name(w), `runs ${w.spec.replicas} replicas without a ${kind}`);
  }
}

// Transport security and tokens agree across the cluster: one --tls mode and server name for
// every gRPC container (a plaintext client cannot reach a TLS server); an admin port always takes
// the admin token (a NetworkPolicy alone lets every pod of the namespace in), and when the nodes'
// admin port takes one, the router and the allocator (its callers) send it.
{
  const containers = workloads.flatMap((w) => (w.spec.template.spec.containers ?? []).map((c) => [name(w), c]));
  for (const flag of ["--tls", "--tls-server-name"]) {
    const values = new Set(containers.map(([, c]) => flagValue(c, flag) ?? "(unset)"));
    if (values.size > 1) fail("cluster", `${flag} differs between containers: ${[...values].join(", ")}`);
  }
  for (const [w, c] of containers) {
    if (flagValue(c, "--admin-listen") !== undefined && flagValue(c, "--admin-token-file") === undefined) {
      fail(w, "its admin port listens without --admin-token-file");
    }
  }
  const node = containers.find(([w]) => w === "StatefulSet/serving-node");
  if (node && flagValue(node[1], "--admin-token-file") !== undefined) {
    for (const caller of ["Deployment/router", "StatefulSet/allocator"]) {
      const c = containers.find(([w]) => w === caller);
      if (c && flagValue(c[1], "--admin-token-file") === undefined) {
        fail(caller, "the nodes' admin port requires a token, but it passes no --admin-token-file");
      }
    }
  }
}

// ---- 3. the ConfigMaps' files, for the binaries' --check-config ---------------------------------
for (const cm of Object.values(configMaps)) {
  const dir = join(args.out, cm.metadata.name);
  mkdirSync(dir, { recursive: true });
  for (const [key, value] of Object.entries(cm.data ?? {})) {
    mkdirSync(dirname(join(dir, key)), { recursive: true });
    writeFileSync(join(dir, key), value);
  }
}

if (failures.length) {
  console.error(`check-manifests: ${failures.length} failure(s) in ${args.rendered}:`);
  for (const f of failures) console.error(`  ${f}`);
  process.exit(1);
}
console.log(`check-manifests: ${docs.length} objects in ${args.rendered}: schema and project checks pass`);
