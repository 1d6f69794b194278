# Interleaved runs of bench_model configurations; per run: decode tok/s per (mode, context),
# this process tree's CPU seconds, everyone else's CPU seconds and steal during the run (from
# /proc/stat), minor page faults, voluntary / involuntary context switches of the run, and the
# AnonHugePages of the benchmark process 0.4 s in. Configurations: a JSON list of [label, "old" |
# "new" | "ping", arguments, extra environment]; "_HOGS" in the environment starts a SCHED_IDLE
# busy loop on each vCPU for the run; "ping" runs pingpong.cpp's binary.
#   python3 runs.py exp3.json 10 > exp3.jsonl
# OLD: bench_model built at b8380ec (before issue 28); NEW: the branch's (exp1: 42d2a58,
# exp3 and exp4: 82b0ebf).
import os, re, resource, subprocess, sys, time, json
OLD = "/tmp/wt28_bench_model_old"
NEW = "/tmp/wt28_bench_model_new"
HZ = os.sysconf("SC_CLK_TCK")
def stat():
    f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    busy = f[0] + f[1] + f[2] + f[5] + f[6]  # user nice system irq softirq
    return busy / HZ, f[7] / HZ
def hog_cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / HZ
def run(label, cmd, env_extra):
    env_extra = dict(env_extra)
    hogs = []
    if env_extra.pop("_HOGS", None):  # a SCHED_IDLE busy loop on each vCPU: no vCPU ever halts
        hogs = [subprocess.Popen(["chrt", "-i", "0", "taskset", "-c", str(c),
                                  "sh", "-c", "while :; do :; done"]) for c in (0, 1)]
        time.sleep(0.2)
    env = dict(os.environ, OMP_NUM_THREADS="2", **env_extra)
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN); b0, s0 = stat(); t0 = time.time()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd="/work/wt28")
    huge = []
    time.sleep(0.4)
    try:
        for line in open(f"/proc/{p.pid}/smaps_rollup"):
            if line.startswith("AnonHugePages"): huge.append(int(line.split()[1]) // 1024)
    except OSError: pass
    out, err = p.communicate()
    wall = time.time() - t0; b1, s1 = stat(); r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    hogs_cpu = 0
    for h in hogs:  # chrt and taskset exec the sh: one pid
        hogs_cpu += hog_cpu(h.pid); h.kill(); h.wait()
    b1 -= hogs_cpu
    ours = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    rows = {}
    for line in out.splitlines():
        c = [x.strip() for x in line.split("|")[1:-1]]
        if c and c[0] in ("bf16", "oscar"):
            rows[f"{c[0]}@{c[2]}"] = float(c[-1])
            if len(c) == 8: rows[f"sleeps@{c[2]}"] = float(c[4])
    reps = [float(m) for m in re.findall(r"decode_tok_s=([\d.]+)", err)]
    rec = dict(label=label, wall=round(wall, 2), ours_cpu=round(ours, 2),
               others_cpu=round(b1 - b0 - ours, 2), steal=round(s1 - s0, 2),
               minflt=r1.ru_minflt - r0.ru_minflt, nvcsw=r1.ru_nvcsw - r0.ru_nvcsw,
               nivcsw=r1.ru_nivcsw - r0.ru_nivcsw, huge_mib=huge, rows=rows, reps=reps)
    print(json.dumps(rec), flush=True)
configs = json.load(open(sys.argv[1]))
rounds = int(sys.argv[2])
for r in range(rounds):
    for label, binary, args, env in configs:
        if binary == "ping":
            out = subprocess.run(["/tmp/wt28/pingpong", "1"], capture_output=True, text=True).stdout
            print(json.dumps(dict(label=label, rows={"wake_us": float(out.split("median ")[1].split()[0]),
                                                   "p10_us": float(out.split("p10 ")[1].split()[0])})), flush=True)
            continue
        run(label, [OLD if binary == "old" else NEW] + args.split(), env)
