package controller

import (
	metricsfilters "sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// MetricsServing is how kairon-controller serves /metrics.
type MetricsServing struct {
	// BindAddress is host:port; "0" turns the endpoint off.
	BindAddress string
	// Secure serves HTTPS and lets a request through only when its bearer
	// token authenticates (TokenReview) and the user may get the
	// non-resource URL /metrics (SubjectAccessReview), as the kubelet and
	// kube-controller-manager do. The controller then needs to create
	// TokenReviews and SubjectAccessReviews, and a scraper a ClusterRole
	// allowing get on /metrics.
	Secure bool
	// CertDir holds tls.crt and tls.key for Secure; without them a
	// self-signed certificate is made at start (scrapers then skip
	// verification, as they do for kube-controller-manager's default).
	CertDir string
}

// Options are the manager's metrics server options for s.
func (s MetricsServing) Options() metricsserver.Options {
	o := metricsserver.Options{BindAddress: s.BindAddress}
	if s.Secure {
		o.SecureServing = true
		o.FilterProvider = metricsfilters.WithAuthenticationAndAuthorization
		o.CertDir = s.CertDir
	}
	return o
}
