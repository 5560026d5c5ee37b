#!/usr/bin/env bash
# Slurm, tried for real: a one-host Slurm from Debian's packages (munged, slurmctld, and two slurmd as two
# nodes: n1 in partition cpu, n2 in partition gpu with two stand-in GPUs), every file of it in a private folder
# under /tmp (config, keys, sockets, state, logs; free ports), runs deploy/slurm/pfcps.sbatch unchanged as a
# heterogeneous job (2 servers on n1, 2 workers on n2, one per GPU) on the quick start
# (deploy/configs/quickstart.ini, ORL s1..s30 packed as deploy/quickstart.sh packs them; 3 of its 8 epochs,
# PFCPS_SLURM_EPOCHS), with the config, the dataset and the output under folders whose names have spaces.
# Checks: it trained (every step, loss fell, model.ckpt and the final line in training.log); each worker saw
# only its own GPU; the servers stopped in order when the workers were done (each logged its stop, both
# components exited 0, nothing "CANCELLED" or "Killed"); no process of the job is left. Then Slurm is taken down
# and its folder removed (also on failure). Skips (77) when Slurm cannot be installed (tests/deploy/slurm/deps.sh;
# root needed) or started here.
# Arguments: SERVER WORKER PFCPS SRC BUILD (tests/deploy/local/cluster.sh).
. "$(dirname "$0")/../../expect.sh"
[ "$(id -u)" -eq 0 ] || skip "a private Slurm (slurmd launching jobs, munged) needs root here"
need_install=0
for c in munged mungekey slurmctld slurmd sbatch squeue scontrol scancel sinfo; do
  command -v "$c" >/dev/null 2>&1 || need_install=1
done
if [ "$need_install" -eq 1 ]; then
  "$(dirname "$0")/deps.sh" || skip "Slurm and munge are not installed and could not be (tests/deploy/slurm/deps.sh)"
fi
source "$(dirname "$0")/../local/cluster.sh" "$@"

# The private Slurm: munge's key and log in a 0700 folder, its socket in a 0755 one (munged's checks).
D=$(mktemp -d /tmp/pfcps-slurm.XXXXXX)
chmod 755 "$D"
mkdir -m 700 "$D/munge"
mkdir -m 755 "$D/run" "$D/etc" "$D/state" "$D/spool" "$D/spool/n1" "$D/spool/n2" "$D/log" "$D/dev"
export SLURM_CONF=$D/etc/slurm.conf
slurm_down() {
  local f p
  [ -d "$D" ] || return 0
  squeue -h -o %i 2>/dev/null | xargs -r scancel 2>/dev/null
  for ((i = 0; i < 150; i++)); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 0.1; done
  for f in slurmd.n1 slurmd.n2 slurmctld munged; do
    p=$(cat "$D/run/$f.pid" 2>/dev/null) || continue
    kill -TERM "$p" 2>/dev/null
    for ((i = 0; i < 100; i++)); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null
  done
  rm -rf "$D"
}
on_exit() { cleanup; slurm_down; }
trap on_exit EXIT
trap 'exit 143' TERM INT HUP # meson's timeout: still take everything down (bash skips EXIT on a fatal signal)

mungekey --create --keyfile="$D/munge/munge.key" >/dev/null 2>&1 || skip "mungekey could not create a key"
munged --socket="$D/run/munge.sock" --key-file="$D/munge/munge.key" --log-file="$D/munge/munged.log" \
  --pid-file="$D/run/munged.pid" --seed-file="$D/munge/munged.seed" 2>"$D/log/munged.err" ||
  skip "munged does not start here: $(cat "$D/log/munged.err")"

ctld_port=$(free_port); n1_port=$(free_port); n2_port=$(free_port)
while [ "$n1_port" = "$ctld_port" ]; do n1_port=$(free_port); done
while [ "$n2_port" = "$ctld_port" ] || [ "$n2_port" = "$n1_port" ]; do n2_port=$(free_port); done
# Two GPUs on n2 for Slurm's bookkeeping (gres needs character devices: links to /dev/null; the workers run on
# the CPU, as the quick start's config says).
ln -s /dev/null "$D/dev/nvidia0"; ln -s /dev/null "$D/dev/nvidia1"
cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) # (nproc obeys OMP_NUM_THREADS, which the tests set)
cat >"$SLURM_CONF" <<EOF
ClusterName=pfcpstest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$D/run/munge.sock
CredType=cred/munge
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/%n
SlurmctldPidFile=$D/run/slurmctld.pid
SlurmdPidFile=$D/run/slurmd.%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
GresTypes=gpu
InactiveLimit=0
KillWait=10
NodeName=n1 NodeHostname=localhost NodeAddr=127.0.0.1 Port=$n1_port CPUs=$cpus RealMemory=1000 State=UNKNOWN
NodeName=n2 NodeHostname=localhost NodeAddr=127.0.0.1 Port=$n2_port CPUs=$cpus RealMemory=1000 Gres=gpu:2 State=UNKNOWN
PartitionName=cpu Nodes=n1 Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=n2 MaxTime=INFINITE State=UP
EOF
echo "NodeName=n2 Name=gpu File=$D/dev/nvidia[0-1]" >"$D/etc/gres.conf"

slurmctld -i 2>"$D/log/slurmctld.err" || skip "slurmctld does not start: $(cat "$D/log/slurmctld.err")"
for n in n1 n2; do
  slurmd -N "$n" 2>"$D/log/slurmd.$n.err" || skip "slurmd -N $n does not start: $(cat "$D/log/slurmd.$n.err")"
done
up=0
for ((i = 0; i < 300; i++)); do
  [ "$(sinfo -h -N -o '%N %T' 2>/dev/null | grep -c ' idle$')" -eq 2 ] && { up=1; break; }
  sleep 0.1
done
[ "$up" -eq 1 ] || { sinfo -N 2>&1; tail -n 5 "$D"/log/*.log; skip "the two Slurm nodes did not come up idle in 30 s"; }

# The run: config, dataset and output under names with spaces.
pack_orl 30
mkdir -p "$TMP/my data" "$TMP/my run"
mv "$TMP/train.rec" "$TMP/train.idx" "$TMP/my data/"
cp "$SRC/deploy/configs/quickstart.ini" "$TMP/my run/quick start.ini"
out="$TMP/my run/out put"
EPOCHS=${PFCPS_SLURM_EPOCHS:-3}
PFCPS_PORT=$(free_port)
export PFCPS_SECRET=slurm-test-secret-$$ PFCPS_BUILD=$BUILD PFCPS_PORT OMP_NUM_THREADS=1
start=$(date +%s)
jobid=$(cd "$TMP/my run" && sbatch --parsable --output="$D/job.out" \
  --partition=cpu --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 --time=10 : \
  --partition=gpu --nodes=1 --ntasks-per-node=2 --gpus-per-node=2 --cpus-per-task=1 --time=10 \
  "$SRC/deploy/slurm/pfcps.sbatch" "quick start.ini" --set "rec=$TMP/my data/train" --set "output=$out" \
  --set "num_epoch=$EPOCHS" 2>"$D/sbatch.err") || { cat "$D/sbatch.err"; die "sbatch refused the job"; }
jobid=${jobid%%;*}
echo "slurm: job $jobid submitted"
done_=0
for ((i = 0; i < 2400; i++)); do
  [ -z "$(squeue -h -j "$jobid" 2>/dev/null)" ] && { done_=1; break; }
  sleep 0.1
done
end=$(date +%s)
show_job() {
  echo "--- job output"; cat "$D/job.out"
  echo "--- slurmctld"; grep -i "JobId=$jobid" "$D/log/slurmctld.log"
  echo "--- queue (state, reason) and nodes"; squeue -h -j "$jobid" -o '%i %T %r' 2>&1; sinfo -N -o '%N %P %T %E' 2>&1
}
[ "$done_" -eq 1 ] || { show_job; die "job $jobid still in the queue after 240 s"; }

# Both components ended with exit 0 (slurmctld's record of each), the script said so, nothing was cancelled.
for c in 0 1; do
  grep -q "_job_complete: JobId=$jobid+$c([0-9]*) WEXITSTATUS 0" "$D/log/slurmctld.log" ||
    { show_job; die "component $c of job $jobid did not exit 0"; }
done
grep -q "pfcps.sbatch: workers done (exit 0)" "$D/job.out" || { show_job; die "workers did not exit 0"; }
grep -q "pfcps.sbatch: servers exited 0" "$D/job.out" || { show_job; die "servers did not exit 0"; }
! grep -qi "CANCELLED\|Killed\|error:" "$D/job.out" || { show_job; die "job output has CANCELLED / Killed / error:"; }
# Each server stopped in order: no new requests, the apply in progress finished, counters logged; by itself once
# every worker had left (server 0 shuts the run down), or on the script's SIGINT.
for r in 0 1; do
  grep -q "server\[$r\] INFO stopped: [0-9]* steps done" "$D/job.out" ||
    { show_job; die "server $r did not log an orderly stop"; }
done
# One GPU per worker task: 0 and 1.
for r in 0 1; do
  grep -q "pfcps.sbatch: worker $r on n2, CUDA_VISIBLE_DEVICES=$r\$" "$D/job.out" ||
    { show_job; die "worker $r did not get GPU $r alone"; }
done
# It trained: every step, loss fell, the checkpoint and the final line.
log=$out/training.log
[ -s "$out/model.ckpt" ] || { show_job; die "no model.ckpt in '$out'"; }
grep -q "training done: $((EPOCHS * 18)) of $((EPOCHS * 18)) steps, first loss [0-9.]*, final loss [0-9.]*" "$log" ||
  { show_job; die "training.log has no 'training done: ... final loss' line"; }
first=$(grep -m1 -o 'Loss [0-9.]*' "$log" | awk '{print $2}')
last=$(grep -o 'Loss [0-9.]*' "$log" | tail -n 1 | awk '{print $2}')
loss_fell "$first" "$last" || die "loss did not fall: $first -> $last"

# No process of the job is left (a task's environment names its job).
sleep 0.5
left=$(grep -lszE "^SLURM_(HET_)?JOB_ID=$jobid\$" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3 || true)
[ -z "$left" ] || { ps -o pid,args -p "$(echo "$left" | paste -sd,)"; die "processes of job $jobid left: $left"; }
! pgrep -f "slurmstepd: \[$jobid" >/dev/null || die "a slurmstepd of job $jobid is left"

# Where the time went (slurmctld's log): submitted, started, ended.
grep -E "submit_batch_het_job: JobId=$jobid |_start_job: Started JobId=$jobid\+0|_job_complete: JobId=$jobid\+1\([0-9]*\) done" \
  "$D/log/slurmctld.log" | sed 's/^/slurm: /'
grep -o "training done: .*" "$log" | sed 's/^/slurm: /'
how="by themselves"
! grep -q "SIGINT to step" "$D/job.out" || how="on SIGINT"
echo "slurm: job $jobid trained $EPOCHS epochs (loss $first -> $last), servers stopped in order ($how)," \
  "in $((end - start)) s"
# Slurm down: its daemons gone, its folder removed.
daemons=$(cat "$D"/run/*.pid | paste -sd' ')
cleanup; trap - EXIT; slurm_down
for p in $daemons; do ! kill -0 "$p" 2>/dev/null || die "Slurm/munge daemon $p still runs"; done
[ ! -d "$D" ] || die "$D left"
echo "slurm: PASS"
