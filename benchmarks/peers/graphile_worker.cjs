// Graphile Worker in the benchmark: one Node.js process running `run()` with the preset
// GRAPHILE_PRESET names ("defaults", or "tuned": the configuration of its performance page).
// `node graphile_worker.cjs migrate` installs its schema. Its one task, "record", writes the
// job's id and times to BENCH_RECORD as every benchmark job does (benchmarks/measure.py).
"use strict";
const fs = require("node:fs");
const { run, runMigrations } = require("graphile-worker");

const connectionString = process.env.DATABASE_URL;
const TUNED = {
  concurrentJobs: 24,
  maxPoolSize: 25,
  localQueue: { size: 500 },
  completeJobBatchDelay: 0,
  failJobBatchDelay: 0,
};

function now() {
  return (performance.timeOrigin + performance.now()) / 1000;
}

let fd = null;
const taskList = {
  record: async (payload) => {
    const start = now();
    if (fd === null) fd = fs.openSync(process.env.BENCH_RECORD, "a");
    const id = String(payload.i).padStart(8, "0");
    fs.writeSync(fd, `${id} ${start.toFixed(6).padStart(17, "0")} ${now().toFixed(6).padStart(17, "0")}\n`);
  },
};

// run.py --shapes names:N: the same task under N identifiers, record0, record1, ...
for (let i = 0; i < Number(process.env.BENCH_SHAPE?.startsWith("names:") ? process.env.BENCH_SHAPE.slice(6) : 0); i++) {
  taskList[`record${i}`] = taskList.record;
}

async function main() {
  if (process.argv[2] === "migrate") {
    await runMigrations({ connectionString });
    return;
  }
  const tuned = process.env.GRAPHILE_PRESET === "tuned";
  const runner = await run({ preset: { worker: { connectionString, ...(tuned ? TUNED : {}) } }, taskList });
  await runner.promise;
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
