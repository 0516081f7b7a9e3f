#!/usr/bin/env bash
# One shardscribe job on a Slurm allocation: a Ray head on the first node, a Ray worker on
# each other node, the job submitted to the head, every Ray process stopped at the end.
#   sbatch docs/cluster/slurm.sh s3://BUCKET/corpus/ s3://BUCKET/transcripts/
# Assumes the venv with shardscribe (and its [s3] extra) on a path every node sees. It
# starts the job only once `ray status` shows every node of the allocation (RAY_WAIT_S).
# Ray listens on the nodes' cluster-network addresses; the job token below is this job's
# own secret, readable by this user only, shared with the nodes through the environment.
#SBATCH --job-name=shardscribe
#SBATCH --nodes=3
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=1
#SBATCH --cpus-per-task=16
#SBATCH --time=48:00:00
set -euo pipefail
INPUT=${1:?input URI}
OUTPUT=${2:?output URI}

export RAY_AUTH_MODE=token
RAY_AUTH_TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(32))')
export RAY_AUTH_TOKEN

nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))
head=${nodes[0]}
head_ip=$(srun --nodes=1 --ntasks=1 -w "$head" hostname --ip-address | awk '{print $1}')
port=6379
# How long the Ray nodes may take to come up (image pulls, a busy shared file system).
RAY_WAIT_S=${RAY_WAIT_S:-300}

# Live Ray nodes: `ray status` lists each under "Active:" as " 1 node_<id>"; 0 while the
# head does not answer yet (or refuses the token).
nodes_up() {
  ray status --address="$head_ip:$port" 2>/dev/null | grep -c '^ *1 node_' || true
}

# Polls until $1 nodes are up; past RAY_WAIT_S the job stops here, before any work is
# submitted, instead of running on fewer nodes than it asked for.
wait_for_nodes() {
  local deadline=$((SECONDS + RAY_WAIT_S))
  until [ "$(nodes_up)" -ge "$1" ]; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "slurm.sh: $(nodes_up) of $1 Ray nodes up after ${RAY_WAIT_S} s (RAY_WAIT_S); see the ray start output" >&2
      exit 1
    fi
    sleep 5
  done
}

srun --nodes=1 --ntasks=1 -w "$head" \
  ray start --head --node-ip-address="$head_ip" --port=$port --dashboard-host=127.0.0.1 \
  --num-cpus="$SLURM_CPUS_PER_TASK" --num-gpus=1 --block &
wait_for_nodes 1
for node in "${nodes[@]:1}"; do
  srun --nodes=1 --ntasks=1 -w "$node" \
    ray start --address="$head_ip:$port" --num-cpus="$SLURM_CPUS_PER_TASK" --num-gpus=1 --block &
done
wait_for_nodes "${#nodes[@]}"

# The driver runs on the head node and joins the cluster (ray.address; exporting
# RAY_ADDRESS="$head_ip:$port" instead does the same); one model actor per GPU
# (ray.decode_actors: auto); a rerun of this script resumes.
srun --nodes=1 --ntasks=1 --overlap -w "$head" \
  shardscribe transcribe --input "$INPUT" --output "$OUTPUT" \
  --set ray.address="$head_ip:$port"

# The --block ray start steps end with the allocation.

