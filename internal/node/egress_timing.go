package node

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// The two steps of the node's that a claim with spec.egress waits for
// before it is Bound: programming the Machine's rules, then reporting them
// in force in the MachineNetworkPolicy's status. Labelled by node, as
// kairon-local runs several agents in one process.
var (
	egressApplyDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kairon_egress_apply_duration_seconds",
		Help:    "Time kairon-node took to program one Machine's egress rules (one nftables transaction), whether it succeeded or not.",
		Buckets: egressStepBuckets,
	}, []string{"node"})
	egressReportDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kairon_egress_report_duration_seconds",
		Help:    "Time kairon-node took to write its entry in a MachineNetworkPolicy's status, the report a claim with spec.egress waits for before it is Bound.",
		Buckets: egressStepBuckets,
	}, []string{"node"})
)

// egressStepBuckets span a few milliseconds (an idle node) to seconds (an
// API server that is struggling).
var egressStepBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5}

func init() { metrics.Registry.MustRegister(egressApplyDuration, egressReportDuration) }

// observeSince records the time since began in h for node.
func observeSince(h *prometheus.HistogramVec, node string, began time.Time) {
	h.WithLabelValues(node).Observe(time.Since(began).Seconds())
}
