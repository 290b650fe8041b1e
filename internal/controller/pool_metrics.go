package controller

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

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

func init() {
	// controller-runtime's registry is what kairon-controller serves on /metrics.
	metrics.Registry.MustRegister(claimBindDuration, poolMembers, claimBindConflicts)
}

// recordPoolMembers publishes one pool's member counts.
func recordPoolMembers(namespace, pool string, warm, booting, claimed int) {
	poolMembers.WithLabelValues(namespace, pool, memberStateWarm).Set(float64(warm))
	poolMembers.WithLabelValues(namespace, pool, memberStateBooting).Set(float64(booting))
	poolMembers.WithLabelValues(namespace, pool, memberStateClaimed).Set(float64(claimed))
}

// forgetPoolMembers drops a deleted pool's series, so /metrics does not
// report pools that no longer exist.
func forgetPoolMembers(namespace, pool string) {
	poolMembers.DeletePartialMatch(prometheus.Labels{"namespace": namespace, "pool": pool})
}
