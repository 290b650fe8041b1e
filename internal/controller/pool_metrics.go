package controller

import (
	"github.com/prometheus/client_golang/prometheus"
)

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
