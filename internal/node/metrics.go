package node

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Every metric kairon-node exports is declared in this file and registered
// here, once, with controller-runtime's registry, which the agent's manager
// serves on its metrics endpoint; the agent's components only record into
// them. docs/guides/observability.md lists them for users.

func init() {
	metrics.Registry.MustRegister(egressApplyDuration, egressReportDuration, egressMetrics)
}

// Egress enforcement.

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

// observeSince records the time since began in h for node.
func observeSince(h *prometheus.HistogramVec, node string, began time.Time) {
	h.WithLabelValues(node).Observe(time.Since(began).Seconds())
}

// egressStepBuckets span a few milliseconds (an idle node) to seconds (an
// API server that is struggling).
var egressStepBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5}

// egressDeniedDesc is kairon_egress_denied_total, which egressMetrics
// sums, at scrape time, from every agent's enforcer counters and its own
// refusals.
var egressDeniedDesc = prometheus.NewDesc("kairon_egress_denied_total",
	"Packets and DNS queries of Machines confined by a MachineNetworkPolicy that were refused, by reason: ip (destination allowed by no policy), port (destination allowed, not the port or protocol), icmp, dns (a name no policy allows), sni (a TLS connection whose server name its grant does not allow).",
	[]string{"namespace", "machine", "reason"}, nil)

// egressMetrics is the process's one egressCollector; each agent adds
// itself while it runs.
var egressMetrics = &egressCollector{agents: map[*Agent]struct{}{}}
