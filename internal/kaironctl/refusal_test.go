package kaironctl

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/ops"
	"github.com/zyvor/kairon/internal/rules"
)

// viaAPIServer is err as the API server passes on a webhook's refusal: the
// status kept, the message prefixed with who denied the request.
func viaAPIServer(err *apierrors.StatusError) *apierrors.StatusError {
	s := err.ErrStatus
	s.Message = `admission webhook "vmachinemigration.kairon.zyvor.dev" denied the request: ` + s.Message
	return &apierrors.StatusError{ErrStatus: s}
}

func TestErrorClassification(t *testing.T) {
	m := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-2"}}
	migGK := kaironv1.GroupVersion.WithKind("MachineMigration").GroupKind()
	budget := viaAPIServer(rules.NewDisruptionRefusal(m, "budget ns/web-tier allows no more disruptions (2 healthy, 2 desired, 0 allowed)"))
	machineGone := viaAPIServer(apierrors.NewInvalid(migGK, "web-2-evac-<generated>", field.ErrorList{
		field.Invalid(field.NewPath("spec", "machineName"), "web-2", `no Machine named "web-2" exists in namespace "ns"`)}))
	badTarget := apierrors.NewInvalid(migGK, "web-2-mig-x", field.ErrorList{
		field.TooLong(field.NewPath("spec", "targetNode"), "", 253)})
	// A refusal worded like an admission denial, but not one of ours.
	foreignDenial := apierrors.NewForbidden(schema.GroupResource{Group: kaironv1.GroupVersion.Group, Resource: "machinemigrations"}, "x",
		errors.New(`admission webhook "policy.example.com" denied the request: no`))
	throttled := &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: http.StatusTooManyRequests, Reason: metav1.StatusReasonTooManyRequests}}
	proxyRefused := apierrors.NewBadRequest("address not allowed")
	noSuchKind := &meta.NoKindMatchError{GroupKind: migGK, SearchedVersions: []string{"v1alpha1"}}

	for _, tc := range []struct {
		name                 string
		err                  error
		migrationRefusal     bool
		proxyRefusal         bool
		retriable            bool
		disruptionRefusalWhy string
	}{
		{name: "budget refusal", err: budget, migrationRefusal: true, retriable: true,
			disruptionRefusalWhy: "budget ns/web-tier allows no more disruptions (2 healthy, 2 desired, 0 allowed)"},
		{name: "budget refusal, wrapped", err: fmt.Errorf("creating: %w", budget), migrationRefusal: true, retriable: true,
			disruptionRefusalWhy: "budget ns/web-tier allows no more disruptions (2 healthy, 2 desired, 0 allowed)"},
		{name: "machine deleted meanwhile", err: machineGone, migrationRefusal: true},
		{name: "invalid on another field", err: badTarget},
		{name: "someone else's webhook", err: foreignDenial},
		{name: "429 without a budget cause", err: throttled, retriable: true},
		{name: "proxy refused", err: proxyRefused, proxyRefusal: true},
		{name: "forbidden", err: apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, "n", errors.New("rbac"))},
		{name: "unauthorized", err: apierrors.NewUnauthorized("who are you")},
		{name: "not found", err: apierrors.NewNotFound(schema.GroupResource{Resource: "nodes"}, "n")},
		{name: "method not allowed", err: apierrors.NewMethodNotSupported(schema.GroupResource{Resource: "nodes"}, "watch")},
		{name: "kind not served", err: noSuchKind},
		{name: "server unavailable", err: apierrors.NewServiceUnavailable("restarting"), retriable: true},
		{name: "internal error", err: apierrors.NewInternalError(errors.New("etcd")), retriable: true},
		{name: "network error", err: errors.New("dial tcp 127.0.0.1:6443: connect: connection refused"), retriable: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ops.IsMigrationRefusal(tc.err); got != tc.migrationRefusal {
				t.Errorf("isMigrationRefusal = %v, want %v", got, tc.migrationRefusal)
			}
			if got := isProxyRefusal(tc.err); got != tc.proxyRefusal {
				t.Errorf("isProxyRefusal = %v, want %v", got, tc.proxyRefusal)
			}
			if got := ops.Retriable(tc.err); got != tc.retriable {
				t.Errorf("retriable = %v, want %v", got, tc.retriable)
			}
			if why, _ := rules.IsDisruptionRefusal(tc.err); why != tc.disruptionRefusalWhy {
				t.Errorf("IsDisruptionRefusal why = %q, want %q", why, tc.disruptionRefusalWhy)
			}
		})
	}
}
