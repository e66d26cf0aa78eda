#!/bin/sh
# One-shot preparation job of the compose stack (also runnable outside Docker; tests run it):
#   1. train a model into the repository unless a checkpoint is already there (e.g. mounted),
#   2. load the dataset's features into Redis (resumable, verified before going live),
#   3. load the graph's adjacency rows and the PPR top-K lists of the repository's models into Redis
#      (verified before going live), so replicas started with --graph hold no graph (GRAPH_LOAD=0 skips).
# Settings (environment): REPO, DATASET, MODEL_NAME, MODEL_KIND, REDIS_URL, TRAIN_ARGS, GRAPH_LOAD, GNNSERVE.
# In the compose stack REDIS_URL carries no password and GNNSERVE is gnnserve-launch (docker/launch.py),
# which adds the password from $REDIS_PASSWORD_FILE inside the gnnserve process (never in `ps`).
set -eu
REPO="${REPO:-/models}"
DATASET="${DATASET:-synthetic:20000:0}"
MODEL_NAME="${MODEL_NAME:-demo}"
MODEL_KIND="${MODEL_KIND:-shadow-sage}"
REDIS_URL="${REDIS_URL:?set REDIS_URL, e.g. redis://redis:6379/0 (password from REDIS_PASSWORD_FILE with GNNSERVE=gnnserve-launch)}"
TRAIN_ARGS="${TRAIN_ARGS:-}"
GNNSERVE="${GNNSERVE:-gnnserve}"
GRAPH_LOAD="${GRAPH_LOAD:-1}"

if [ -f "$REPO/$MODEL_NAME/1/config.json" ]; then
  echo "prepare: using the existing checkpoint $REPO/$MODEL_NAME/1"
else
  echo "prepare: training $MODEL_KIND on $DATASET into $REPO/$MODEL_NAME/1"
  # shellcheck disable=SC2086 # TRAIN_ARGS is a list of flags
  $GNNSERVE train --dataset "$DATASET" --model "$MODEL_KIND" --out "$REPO/$MODEL_NAME/1" --no-progress $TRAIN_ARGS
fi
echo "prepare: loading features of $DATASET into Redis"
$GNNSERVE features load --dataset "$DATASET" --redis "$REDIS_URL" --no-progress
if [ "$GRAPH_LOAD" != "0" ]; then
  echo "prepare: loading the graph and PPR top-K lists of $DATASET into Redis"
  $GNNSERVE graph load --dataset "$DATASET" --redis "$REDIS_URL" --repo "$REPO" --no-progress
fi
echo "prepare: done"
