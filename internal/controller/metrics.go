package controller

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// Every metric kairon-controller exports is declared in this file and
// registered here, once, with controller-runtime's registry, which the
// manager serves on its metrics endpoint; the reconcilers only record into
// them. docs/guides/observability.md lists them for users.

func init() {
	metrics.Registry.MustRegister(
		claimBindDuration, poolMembers, claimBindConflicts,
		migrationsFinished, migrationDowntime, migrationDuration,
		machineSnapshots, machineSnapshotPause, machineSnapshotSize,
		DisruptionBudgetStatus, nodeUnreachable, fencedNodes,
		pullCredentialRequests,
	)
	for _, phase := range []kaironv1.MachineSnapshotPhase{kaironv1.SnapshotReady, kaironv1.SnapshotFailed} {
		machineSnapshots.WithLabelValues(string(phase)) // a 0 rather than no series
	}
}

// Warm pools and claims.

// Values of the state label of kairon_machinepool_members. The three are
// disjoint, so summing them gives every live member of a pool.
const (
	// memberStateWarm: unclaimed and Running, so a claim can take it now.
	memberStateWarm = "warm"
	// memberStateBooting: unclaimed, not Running yet.
	memberStateBooting = "booting"
	// memberStateClaimed: held by a MachineClaim.
	memberStateClaimed = "claimed"
)

var (
	// claimBindDuration is the time from a claim's creation to its bind: how
	// long a user waited for a Machine. It includes the wait for a warm member
	// when the pool ran dry, hence buckets up to minutes.
	claimBindDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "kairon_machineclaim_bind_duration_seconds",
		Help:    "Time from a MachineClaim's creation to its bind to a warm Machine.",
		Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300},
	})

	// poolMembers counts each pool's live members by state.
	poolMembers = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kairon_machinepool_members",
		Help: "Live members of a MachinePool by state: warm (Running, unclaimed), booting (unclaimed, not Running yet) or claimed.",
	}, []string{"namespace", "pool", "state"})

	// claimBindConflicts counts binds that lost the race for a Machine: the
	// member changed (another controller bound it, the node agent wrote its
	// status) between the listing and the label patch.
	claimBindConflicts = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kairon_machineclaim_bind_conflicts_total",
		Help: "Bind attempts refused with 409 Conflict because the warm Machine changed since it was listed.",
	})
)

// Migrations.

var (
	// migrationsFinished counts migrations by how they ended, so a rate of
	// failures (by reason) can be alerted on.
	migrationsFinished = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kairon_machinemigrations_total",
		Help: "MachineMigrations that ended, by strategy, phase (Succeeded or Failed) and reason.",
	}, []string{"strategy", "phase", "reason"})

	// migrationDowntime is how long guests did not run while they moved:
	// milliseconds for live, seconds for cold.
	migrationDowntime = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kairon_machinemigration_downtime_seconds",
		Help:    "How long the guest did not run during a MachineMigration that succeeded.",
		Buckets: []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
	}, []string{"strategy"})

	// migrationDuration is the time from a migration's start to its end.
	migrationDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kairon_machinemigration_duration_seconds",
		Help:    "Time from a MachineMigration's start (phase Running) to its end, by strategy and phase.",
		Buckets: []float64{0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300},
	}, []string{"strategy", "phase"})
)

// Snapshots, recorded once per MachineSnapshot that ended.

var (
	machineSnapshots = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kairon_machine_snapshots_total",
		Help: "MachineSnapshots that ended, by phase (Ready or Failed).",
	}, []string{"phase"})
	machineSnapshotPause = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "kairon_machine_snapshot_duration_seconds",
		Help:    "How long taking a MachineSnapshot paused the guest: the save of its memory and devices (status.pauseMillis).",
		Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60},
	})
	machineSnapshotSize = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "kairon_machine_snapshot_size_bytes",
		Help:    "Size of each Ready MachineSnapshot's state file (status.sizeBytes).",
		Buckets: prometheus.ExponentialBuckets(16<<20, 2, 10), // 16 MiB to 8 GiB
	})
)

// Nodes.

var (
	// nodeUnreachable is 1 for each Kairon node whose agent's Lease expired, 0
	// for one that renews it.
	nodeUnreachable = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kairon_node_unreachable",
		Help: "1 while a Kairon node's agent has not renewed its Lease for the grace period (kairon-controller -node-grace-period), 0 while it renews it.",
	}, []string{"node"})

	// fencedNodes is kairon_fenced_nodes.
	fencedNodes = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kairon_fenced_nodes",
		Help: "Kairon nodes carrying the fence taint (kaironctl fence), which kaironctl recover lifts.",
	})
)

// Disruption budgets.

// Values of the field label of kairon_disruption_budget_status.
const (
	BudgetFieldExpectedMachines   = "expected_machines"
	BudgetFieldCurrentHealthy     = "current_healthy"
	BudgetFieldDesiredHealthy     = "desired_healthy"
	BudgetFieldDisruptionsAllowed = "disruptions_allowed"
)

// DisruptionBudgetStatus is the gauge kairon_disruption_budget_status
// {namespace, budget, field}: each budget's status numbers as its object has
// them, set after the pass's status patch from what the API server returned
// (or, when the patch failed, from the status the object still has), so the
// gauge is never ahead of the object. A budget whose status was never written
// has no series. It is registered with controller-runtime's metrics.Registry,
// which the manager serves on its metrics endpoint.
var DisruptionBudgetStatus = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "kairon_disruption_budget_status",
	Help: "Status of a MachineDisruptionBudget as last written to the object by kairon-controller; " +
		"field is expected_machines, current_healthy, desired_healthy or disruptions_allowed.",
}, []string{"namespace", "budget", "field"})

// Node agents' pull credentials.

// pullCredentialRequests counts the answers of PullCredentialsPath by
// HTTP status code: 403s mean an agent asked for a Machine not its own,
// 404s a Secret or Machine that is missing (yet).
var pullCredentialRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "kairon_pull_credentials_requests_total",
	Help: "Requests of node agents for the pull secrets of their Machines, by HTTP status code of the answer.",
}, []string{"code"})
