#!/usr/bin/env bash
# End-to-end test of the chart on kind: one manager cluster and two workers with fake NUMA
# zones, cert-manager in each, Switchyard installed as users install it, then:
#   - a submitted Job runs in exactly one worker;
#   - its status appears on the manager as it progresses;
#   - a Job that fits no worker NUMA-aligned stays pending, with the reason visible;
#   - deleting the manager's Job removes the worker's copy;
#   - a JobSet (the JobSet controller installed in every cluster, the chart with
#     jobset.enabled=true) runs in one worker and ends Completed on the manager, whose own
#     JobSet controller leaves it alone;
#   - a worker taken down makes its Jobs requeue after the queue's workerLostTimeout.
#
#   e2e/run.sh                 needs docker (a running engine), kind, kubectl and helm
#   KEEP=1 e2e/run.sh          leaves the clusters up afterwards
#   KIND_NODE_IMAGE=kindest/node:v1.34.0 e2e/run.sh
#                              default kindest/node:v1.33.1; the manager needs Kubernetes
#                              1.32+ (Job spec.managedBy), which older kind releases do not
#                              create by default
#   CERT_MANAGER_VERSION=v1.16.2 (default)
#   JOBSET_VERSION=v0.11.0 (default; the version tests/realk8s runs)
#
# Without those tools it says so in one line and exits 0 (CI machines without Docker).
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
if ! command -v docker >/dev/null 2>&1 || ! docker info >/dev/null 2>&1; then
  missing+=("docker engine")
fi
for tool in kind kubectl helm; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if ((${#missing[@]})); then
  list=$(printf ', %s' "${missing[@]}")
  echo "e2e: skipped: ${list:2} not available (needs docker, kind, kubectl, helm)"
  exit 0
fi

IMAGE_REPOSITORY=switchyard
IMAGE_TAG=e2e
NAMESPACE=switchyard-system
JOBS_NAMESPACE=e2e
MANAGER=switchyard-manager
WORKERS=(switchyard-worker-1 switchyard-worker-2)
CERT_MANAGER_VERSION="${CERT_MANAGER_VERSION:-v1.16.2}"
KIND_NODE_IMAGE="${KIND_NODE_IMAGE:-kindest/node:v1.33.1}"
CERT_MANAGER_URL="https://github.com/cert-manager/cert-manager/releases/download/${CERT_MANAGER_VERSION}/cert-manager.yaml"
JOBSET_VERSION="${JOBSET_VERSION:-v0.11.0}"
JOBSET_URL="https://github.com/kubernetes-sigs/jobset/releases/download/${JOBSET_VERSION}/manifests.yaml"
# How long a worker may be unreachable before its Jobs are taken back (the queue's setting).
WORKER_LOST_TIMEOUT_SECONDS=60
work="$(mktemp -d)"

log() { printf 'e2e: %s\n' "$*"; }

# The WorkerCluster name of a kind cluster: worker-1 for switchyard-worker-1.
worker_name() { echo "${1#switchyard-}"; }

# The manager pod holding the dispatcher's Lease (identity "<pod>_<suffix>"), else any.
leader_pod() {
  local holder
  holder=$(kubectl --context "kind-$MANAGER" -n "$NAMESPACE" get lease switchyard-leader \
    -o jsonpath='{.spec.holderIdentity}' 2>/dev/null || true)
  if [[ -n "$holder" ]]; then
    echo "pod/${holder%_*}"
  else
    echo deployment/switchyard
  fi
}

on_exit() {
  local status=$?
  if ((status != 0)); then
    log "FAILED; logs of the manager's leader:"
    kubectl --context "kind-$MANAGER" -n "$NAMESPACE" logs "$(leader_pod)" --tail=80 2>/dev/null || true
    kubectl --context "kind-$MANAGER" get workerclusters,dispatchqueues 2>/dev/null || true
    kubectl --context "kind-$MANAGER" get jobsets -A 2>/dev/null || true
  fi
  if [[ "${KEEP:-}" == 1 ]]; then
    log "KEEP=1: clusters left running: $MANAGER ${WORKERS[*]} (kind delete cluster --name NAME)"
  else
    for cluster in "$MANAGER" "${WORKERS[@]}"; do
      kind delete cluster --name "$cluster" >/dev/null 2>&1 || true
    done
  fi
  rm -rf "$work"
  exit "$status"
}
trap on_exit EXIT

fail() {
  log "FAIL: $*"
  exit 1
}

# wait_for DESCRIPTION SECONDS COMMAND...: runs COMMAND every 2 s until it succeeds.
wait_for() {
  local what=$1 seconds=$2
  shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || fail "$what: not within ${seconds}s"
    sleep 2
  done
}

m() { kubectl --context "kind-$MANAGER" "$@"; }
w() {
  local cluster=$1
  shift
  kubectl --context "kind-$cluster" "$@"
}

# ---------------------------------------------------------------------------------------
# Setup

build_image() {
  log "building ${IMAGE_REPOSITORY}:${IMAGE_TAG}"
  docker build --quiet -t "${IMAGE_REPOSITORY}:${IMAGE_TAG}" . >/dev/null
}

create_clusters() {
  for cluster in "$MANAGER" "${WORKERS[@]}"; do
    log "creating kind cluster $cluster ($KIND_NODE_IMAGE)"
    kind create cluster --name "$cluster" --image "$KIND_NODE_IMAGE" --wait 180s >/dev/null
    kind load docker-image "${IMAGE_REPOSITORY}:${IMAGE_TAG}" --name "$cluster" >/dev/null
  done
}

install_cert_manager() {
  for cluster in "$MANAGER" "${WORKERS[@]}"; do
    log "installing cert-manager ${CERT_MANAGER_VERSION} in $cluster"
    w "$cluster" apply -f "$CERT_MANAGER_URL" >/dev/null
    w "$cluster" -n cert-manager wait --for=condition=Available deployment --all --timeout=300s >/dev/null
    # Available is not enough: cert-manager's own webhook answers only once cainjector has
    # given it its CA. Until then creating the chart's Issuers fails with an x509 error.
    wait_for "cert-manager's webhook in $cluster" 180 cert_manager_answers "$cluster"
  done
}

cert_manager_answers() {
  w "$1" apply --dry-run=server -f - <<EOF
apiVersion: cert-manager.io/v1
kind: ClusterIssuer
metadata: {name: e2e-probe}
spec: {selfSigned: {}}
EOF
}

# The JobSet controller in every cluster, before the chart: its release manifest, applied
# server-side (its CRD is too big for the annotation of a client-side apply).
install_jobset() {
  for cluster in "$MANAGER" "${WORKERS[@]}"; do
    log "installing the JobSet controller ${JOBSET_VERSION} in $cluster"
    w "$cluster" apply --server-side -f "$JOBSET_URL" >/dev/null
    w "$cluster" wait --for=condition=Established crd/jobsets.jobset.x-k8s.io --timeout=60s >/dev/null
    w "$cluster" -n jobset-system wait --for=condition=Available deployment --all --timeout=300s >/dev/null
    # Available comes before its webhooks answer (it makes their certificate itself).
    wait_for "the JobSet webhooks in $cluster" 180 jobset_answers "$cluster"
  done
}

jobset_answers() {
  w "$1" apply --dry-run=server -f - <<EOF
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata: {name: e2e-probe, namespace: default}
spec:
  replicatedJobs:
    - name: probe
      template:
        spec:
          template:
            spec:
              restartPolicy: Never
              containers: [{name: main, image: busybox:1.36}]
EOF
}

# One fake NUMA zone N of a NodeResourceTopology: 2 CPUs and 4Gi, nearer to itself.
nrt_zone() {
  cat <<EOF
  - name: node-$1
    type: Node
    costs: [{name: node-0, value: $((1 == $1 ? 20 : 10))}, {name: node-1, value: $((1 == $1 ? 10 : 20))}]
    resources:
      - {name: cpu, capacity: "2", allocatable: "2", available: "2"}
      - {name: memory, capacity: 4Gi, allocatable: 4Gi, available: 4Gi}
EOF
}

# Two NUMA zones of 2 CPUs and 4Gi each, single-numa-node, on every node of a worker.
publish_fake_numa_zones() {
  local cluster=$1
  w "$cluster" apply -f e2e/nrt-crd.yaml >/dev/null
  w "$cluster" wait --for=condition=Established crd/noderesourcetopologies.topology.node.k8s.io --timeout=60s >/dev/null
  for node in $(w "$cluster" get nodes -o name); do
    node=${node#node/}
    w "$cluster" apply -f - >/dev/null <<EOF
apiVersion: topology.node.k8s.io/v1alpha2
kind: NodeResourceTopology
metadata:
  name: $node
topologyPolicies: [SingleNUMANodePodLevel]
attributes:
  - {name: topologyManagerPolicy, value: single-numa-node}
  - {name: topologyManagerScope, value: pod}
zones:
$(nrt_zone 0)
$(nrt_zone 1)
EOF
  done
}

install_chart() {
  local common=(--namespace "$NAMESPACE" --create-namespace --wait --timeout 5m
    --set image.repository="$IMAGE_REPOSITORY" --set image.tag="$IMAGE_TAG"
    --set jobset.enabled=true)
  log "installing the chart as manager in $MANAGER"
  helm --kube-context "kind-$MANAGER" install switchyard charts/switchyard "${common[@]}" >/dev/null
  for cluster in "${WORKERS[@]}"; do
    publish_fake_numa_zones "$cluster"
    log "installing the chart as worker in $cluster"
    # Workers get no CRDs; their own scheduler places the pods the manager sends, NUMA-aware.
    helm --kube-context "kind-$cluster" install switchyard charts/switchyard "${common[@]}" \
      --skip-crds --set role=worker --set scheduler.enabled=true >/dev/null
  done
  for cluster in "$MANAGER" "${WORKERS[@]}"; do
    w "$cluster" create namespace "$JOBS_NAMESPACE" >/dev/null
  done
}

# Each worker registered as the README's "Register a worker" shows: `switchyard register-worker`
# (built here on the host, as a user runs it) with the worker's kind context, and the address
# the manager's pods reach: the worker's control-plane container on the kind network. It waits
# for the token controller to fill the token Secret the worker install made.
register_workers() {
  log "building switchyard on the host for register-worker"
  cargo build --quiet --locked --bin switchyard || fail "cargo build --bin switchyard failed"
  local bin=target/debug/switchyard
  for cluster in "${WORKERS[@]}"; do
    local name ip
    name=$(worker_name "$cluster")
    ip=$(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$cluster-control-plane")
    "$bin" register-worker "$name" --context "kind-$cluster" --server "https://$ip:6443" \
      --namespace "$NAMESPACE" --scheduler-name switchyard-scheduler --wait 60 \
      >"$work/$name.yaml" 2>"$work/$name.register.log" ||
      fail "switchyard register-worker $name: $(cat "$work/$name.register.log")"
    m apply -f "$work/$name.yaml" >/dev/null
  done
  for cluster in "${WORKERS[@]}"; do
    log "waiting for WorkerCluster $(worker_name "$cluster") to be Active"
    m wait "workercluster/$(worker_name "$cluster")" --for=condition=Active --timeout=180s >/dev/null ||
      fail "WorkerCluster $(worker_name "$cluster") is not Active: $(m get workercluster "$(worker_name "$cluster")" -o jsonpath='{.status.conditions}')"
  done
  m apply -f - >/dev/null <<EOF
apiVersion: switchyard.dev/v1alpha1
kind: DispatchQueue
metadata:
  name: e2e
spec:
  clusters: [$(worker_name "${WORKERS[0]}"), $(worker_name "${WORKERS[1]}")]
  workerLostTimeout: ${WORKER_LOST_TIMEOUT_SECONDS}s
EOF
  m wait dispatchqueue/e2e --for=condition=Active --timeout=60s >/dev/null
}

# submit_job NAME CPU SECONDS: a Guaranteed one-pod Job in the queue, sleeping SECONDS.
submit_job() {
  m -n "$JOBS_NAMESPACE" apply -f - >/dev/null <<EOF
apiVersion: batch/v1
kind: Job
metadata:
  name: $1
  labels: {switchyard.dev/queue-name: e2e}
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: main
          image: busybox:1.36
          command: [sleep, "$3"]
          resources:
            requests: {cpu: "$2", memory: 64Mi}
            limits: {cpu: "$2", memory: 64Mi}
EOF
}

# The worker cluster the manager's Job went to (annotation switchyard.dev/cluster), or "".
dispatched_to() {
  m -n "$JOBS_NAMESPACE" get job "$1" -o jsonpath='{.metadata.annotations.switchyard\.dev/cluster}' 2>/dev/null
}

is_dispatched() { [[ -n $(dispatched_to "$1") ]]; }

# job_field CLUSTER JOB JSONPATH: one field of a Job in the jobs namespace.
job_field() {
  w "$1" -n "$JOBS_NAMESPACE" get job "$2" -o jsonpath="$3" 2>/dev/null
}

field_is() { [[ $(job_field "$1" "$2" "$3") == "$4" ]]; }

# The field has a value, and not that one (a failed read is not a change).
field_is_not() {
  local value
  value=$(job_field "$1" "$2" "$3") || return 1
  [[ -n "$value" && "$value" != "$4" ]]
}

has_running_pod() {
  w "$1" -n "$JOBS_NAMESPACE" get pods -l "job-name=$2" -o jsonpath='{.items[*].status.phase}' | grep -q Running
}

has_no_job() { ! w "$1" -n "$JOBS_NAMESPACE" get job "$2" >/dev/null 2>&1; }

# The kind clusters holding a copy of Job NAME (same name and namespace, our origin label).
# (kubectl refuses a name together with -l, so the label is read and compared.)
workers_with_copy() {
  for cluster in "${WORKERS[@]}"; do
    if [[ $(job_field "$cluster" "$1" '{.metadata.labels.switchyard\.dev/origin}') == switchyard ]]; then
      echo "$cluster"
    fi
  done
}

# submit_jobset NAME SECONDS: a JobSet in the queue, replicated Jobs leader ×1 and workers ×2
# of one Guaranteed pod each, the same pod in both (Switchyard places a JobSet whose
# replicated Jobs ask for the same pods), sleeping SECONDS.
submit_jobset() {
  local template
  template=$(
    cat <<EOF
        spec:
          backoffLimit: 0
          template:
            spec:
              restartPolicy: Never
              containers:
                - name: main
                  image: busybox:1.36
                  command: [sleep, "$2"]
                  resources:
                    requests: {cpu: 500m, memory: 64Mi}
                    limits: {cpu: 500m, memory: 64Mi}
EOF
  )
  m -n "$JOBS_NAMESPACE" apply -f - >/dev/null <<EOF
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata:
  name: $1
  labels: {switchyard.dev/queue-name: e2e}
spec:
  replicatedJobs:
    - name: leader
      replicas: 1
      template:
$template
    - name: workers
      replicas: 2
      template:
$template
EOF
}

# jobset_field CLUSTER JOBSET JSONPATH: one field of a JobSet in the jobs namespace.
jobset_field() {
  w "$1" -n "$JOBS_NAMESPACE" get jobset "$2" -o jsonpath="$3" 2>/dev/null
}

jobset_field_is() { [[ $(jobset_field "$1" "$2" "$3") == "$4" ]]; }

# The worker cluster the manager's JobSet went to, or "".
jobset_dispatched_to() {
  jobset_field "$MANAGER" "$1" '{.metadata.annotations.switchyard\.dev/cluster}'
}

jobset_is_dispatched() { [[ -n $(jobset_dispatched_to "$1") ]]; }

# The kind clusters holding a copy of JobSet NAME.
workers_with_jobset_copy() {
  for cluster in "${WORKERS[@]}"; do
    if [[ $(jobset_field "$cluster" "$1" '{.metadata.labels.switchyard\.dev/origin}') == switchyard ]]; then
      echo "$cluster"
    fi
  done
}

has_no_jobset() { ! w "$1" -n "$JOBS_NAMESPACE" get jobset "$2" >/dev/null 2>&1; }

# Words in a string (wc pads its count with spaces on macOS).
count() {
  local words
  read -r -a words <<<"$1"
  echo "${#words[@]}"
}

# ---------------------------------------------------------------------------------------
# Checks

check_job_runs_in_exactly_one_worker() {
  log "check: a submitted Job runs in exactly one worker"
  submit_job one-worker 1 45
  wait_for "Job one-worker dispatched" 120 is_dispatched one-worker
  local target copies
  target=$(dispatched_to one-worker)
  copies=$(workers_with_copy one-worker)
  [[ $(count "$copies") == 1 ]] || fail "Job one-worker has copies in [$copies], want exactly one"
  [[ $(worker_name "$copies") == "$target" ]] || fail "Job one-worker is annotated $target but its copy is in $copies"
  wait_for "pod of one-worker running in $copies" 120 has_running_pod "$copies" one-worker
  [[ -z $(m -n "$JOBS_NAMESPACE" get pods -l job-name=one-worker -o name) ]] ||
    fail "Job one-worker also has pods in the manager"
}

check_status_is_mirrored_on_the_manager() {
  log "check: the Job's status appears on the manager as it progresses"
  wait_for "manager's one-worker shows an active pod" 60 \
    field_is "$MANAGER" one-worker '{.status.active}' 1
  wait_for "manager's one-worker shows Complete" 180 \
    field_is "$MANAGER" one-worker '{.status.conditions[?(@.type=="Complete")].status}' True
  field_is "$MANAGER" one-worker '{.status.succeeded}' 1 ||
    fail "manager's one-worker is Complete without succeeded=1"
}

check_unfit_job_stays_pending_with_reason() {
  log "check: a Job that fits no worker NUMA-aligned stays pending, with the reason visible"
  # 3 CPUs in one NUMA zone; the largest zone anywhere has 2.
  submit_job too-wide 3 30
  sleep 30
  [[ -z $(dispatched_to too-wide) ]] || fail "Job too-wide was dispatched to $(dispatched_to too-wide)"
  [[ -z $(workers_with_copy too-wide) ]] || fail "Job too-wide has a copy in a worker"
  [[ $(m -n "$JOBS_NAMESPACE" get job too-wide -o jsonpath='{.spec.suspend}') == true ]] ||
    fail "Job too-wide is not suspended"
  local why
  why=$(m -n "$JOBS_NAMESPACE" describe job too-wide)
  grep -qi 'numa' <<<"$why" || fail "no NUMA reason on Job too-wide:"$'\n'"$why"
  m -n "$JOBS_NAMESPACE" delete job too-wide --wait=false >/dev/null
}

check_deleting_the_managers_job_deletes_the_worker_copy() {
  log "check: deleting the manager's Job removes the worker's copy"
  submit_job short-lived 1 600
  wait_for "Job short-lived dispatched" 120 is_dispatched short-lived
  local copy
  copy=$(workers_with_copy short-lived)
  [[ -n "$copy" ]] || fail "Job short-lived is dispatched but has no copy"
  m -n "$JOBS_NAMESPACE" delete job short-lived >/dev/null
  wait_for "copy of short-lived removed from $copy" 120 has_no_job "$copy" short-lived
}

check_jobset_runs_across_the_clusters() {
  log "check: a JobSet runs in one worker and ends Completed on the manager"
  submit_jobset trainer 20
  jobset_field_is "$MANAGER" trainer '{.spec.managedBy}' switchyard.dev/dispatcher ||
    fail "JobSet trainer is not managed by Switchyard: spec.managedBy=$(jobset_field "$MANAGER" trainer '{.spec.managedBy}')"
  wait_for "JobSet trainer dispatched" 120 jobset_is_dispatched trainer
  local target copies status
  target=$(jobset_dispatched_to trainer)
  copies=$(workers_with_jobset_copy trainer)
  [[ $(count "$copies") == 1 ]] || fail "JobSet trainer has copies in [$copies], want exactly one"
  [[ $(worker_name "$copies") == "$target" ]] || fail "JobSet trainer is annotated $target but its copy is in $copies"
  wait_for "manager's trainer Completed" 300 \
    jobset_field_is "$MANAGER" trainer '{.status.terminalState}' Completed
  status=$(jobset_field "$MANAGER" trainer '{.status}')
  jobset_field_is "$MANAGER" trainer '{.status.conditions[?(@.type=="Completed")].status}' True ||
    fail "manager's trainer has terminalState Completed without Completed=True: $status"
  jobset_field_is "$MANAGER" trainer '{.status.replicatedJobsStatus[?(@.name=="leader")].succeeded}' 1 ||
    fail "manager's trainer does not count 1 leader Job succeeded: $status"
  jobset_field_is "$MANAGER" trainer '{.status.replicatedJobsStatus[?(@.name=="workers")].succeeded}' 2 ||
    fail "manager's trainer does not count 2 workers Jobs succeeded: $status"
  [[ -z $(m -n "$JOBS_NAMESPACE" get jobs,pods,services -l jobset.sigs.k8s.io/jobset-name=trainer -o name) &&
    -z $(m -n "$JOBS_NAMESPACE" get service trainer -o name --ignore-not-found) ]] ||
    fail "the manager's JobSet controller ran JobSet trainer itself"
  wait_for "copy of trainer removed from $copies" 120 has_no_jobset "$copies" trainer
}

check_lost_worker_requeues_its_jobs() {
  log "check: a worker taken down makes its Jobs requeue after ${WORKER_LOST_TIMEOUT_SECONDS}s"
  submit_job survivor 1 900
  wait_for "Job survivor dispatched" 120 is_dispatched survivor
  local lost cluster other
  lost=$(dispatched_to survivor)
  cluster="switchyard-$lost"
  for other in "${WORKERS[@]}"; do
    [[ "$other" == "$cluster" ]] || break
  done
  docker stop "$cluster-control-plane" >/dev/null
  # Before the timeout the Job stays where it is; after it, it is taken back and placed again.
  sleep $((WORKER_LOST_TIMEOUT_SECONDS / 2))
  [[ $(dispatched_to survivor) == "$lost" ]] || fail "Job survivor moved before workerLostTimeout"
  wait_for "Job survivor requeued away from $lost" $((WORKER_LOST_TIMEOUT_SECONDS * 3)) \
    field_is_not "$MANAGER" survivor '{.metadata.annotations.switchyard\.dev/cluster}' "$lost"
  wait_for "Job survivor placed again in $(worker_name "$other")" 120 \
    field_is "$MANAGER" survivor '{.metadata.annotations.switchyard\.dev/cluster}' "$(worker_name "$other")"
  [[ $(workers_with_copy survivor) == "$other" ]] ||
    fail "Job survivor's copy is in [$(workers_with_copy survivor)], want $other"
  m wait "workercluster/$lost" --for=condition=Active=False --timeout=30s >/dev/null ||
    fail "WorkerCluster $lost is still Active with its API server stopped"
  docker start "$cluster-control-plane" >/dev/null
}

build_image
create_clusters
install_cert_manager
install_jobset
install_chart
register_workers
check_job_runs_in_exactly_one_worker
check_status_is_mirrored_on_the_manager
check_unfit_job_stays_pending_with_reason
check_deleting_the_managers_job_deletes_the_worker_copy
check_jobset_runs_across_the_clusters
check_lost_worker_requeues_its_jobs
log "all checks passed"
