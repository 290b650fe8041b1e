package node

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/zyvor/kairon/internal/images"
)

// Every metric kairon-node exports is declared in this file and registered
// here, once, with controller-runtime's registry, which the agent's manager
// serves on its metrics endpoint; the agent's components only record into
// them. docs/guides/observability.md lists them for users.

func init() {
	metrics.Registry.MustRegister(egressApplyDuration, egressReportDuration, egressMetrics,
		imagePullDuration, imageConvertDuration, imageCacheRequests, imagePullFailures, imageCacheImages, imageCacheBytes)
}

// OCI images (machine_image.go, internal/images), labelled by node: each
// agent has its own image cache.
var (
	imagePullDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kairon_image_pull_duration_seconds",
		Help:    "Time kairon-node took to download and verify one OCI image that was not cached (manifest, config and layers).",
		Buckets: imageBuckets,
	}, []string{"node"})
	imageConvertDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kairon_image_convert_duration_seconds",
		Help:    "Time kairon-node took to flatten one pulled OCI image into the read-only filesystem its guests boot.",
		Buckets: imageBuckets,
	}, []string{"node"})
	imageCacheRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kairon_image_cache_requests_total",
		Help: "Requests for an OCI image on the node, by result: hit (already cached) or miss (pulled, or waited for a pull of the same image).",
	}, []string{"node", "result"})
	imagePullFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kairon_image_pull_failures_total",
		Help: "OCI image pulls and resolutions that failed, by reason: NotFound, Unauthorized, TooLarge, WrongPlatform, InvalidImage, RegistryUnavailable.",
	}, []string{"node", "reason"})
	imageCacheImages = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kairon_image_cache_images",
		Help: "OCI images in the node's image cache.",
	}, []string{"node"})
	imageCacheBytes = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kairon_image_cache_bytes",
		Help: "Bytes on disk of the node's image cache.",
	}, []string{"node"})
)

// imageBuckets span a small image on a fast disk to a large one over a
// slow link.
var imageBuckets = []float64{0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}

// ImageMetrics records node's image store measurements in the metrics
// above.
func ImageMetrics(node string) images.Metrics { return imageMetrics{node: node} }

type imageMetrics struct{ node string }

func (m imageMetrics) PullDuration(d time.Duration) {
	imagePullDuration.WithLabelValues(m.node).Observe(d.Seconds())
}
func (m imageMetrics) ConvertDuration(d time.Duration) {
	imageConvertDuration.WithLabelValues(m.node).Observe(d.Seconds())
}
func (m imageMetrics) CacheHit()  { imageCacheRequests.WithLabelValues(m.node, "hit").Inc() }
func (m imageMetrics) CacheMiss() { imageCacheRequests.WithLabelValues(m.node, "miss").Inc() }
func (m imageMetrics) PullFailed(reason images.Reason) {
	imagePullFailures.WithLabelValues(m.node, string(reason)).Inc()
}
func (m imageMetrics) CacheUsage(n int, bytes int64) {
	imageCacheImages.WithLabelValues(m.node).Set(float64(n))
	imageCacheBytes.WithLabelValues(m.node).Set(float64(bytes))
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
