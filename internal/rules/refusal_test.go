package rules

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

func TestIsDisruptionRefusal(t *testing.T) {
	m := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "web-1"}}
	refusal := NewDisruptionRefusal(m, `budget team/web allows 0 disruptions`)
	// What a client gets back: the API server keeps the webhook's status
	// and prefixes its message.
	viaServer := &apierrors.StatusError{ErrStatus: *refusal.ErrStatus.DeepCopy()}
	viaServer.ErrStatus.Message = `admission webhook "machinemigrations.kairon.zyvor.dev" denied the request: ` + viaServer.ErrStatus.Message
	otherCause := &apierrors.StatusError{ErrStatus: metav1.Status{Code: http.StatusTooManyRequests,
		Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Type: "Throttled"}}}}}
	for _, tc := range []struct {
		name    string
		err     error
		wantOK  bool
		wantWhy string
	}{
		{"the refusal", refusal, true, "budget team/web allows 0 disruptions"},
		{"as the API server returns it", viaServer, true, "budget team/web allows 0 disruptions"},
		{"wrapped", fmt.Errorf("creating migration: %w", viaServer), true, "budget team/web allows 0 disruptions"},
		{"nil", nil, false, ""},
		{"plain error naming a webhook", errors.New(`admission webhook "x" denied the request: disruption budget`), false, ""},
		{"forbidden", apierrors.NewForbidden(schema.GroupResource{Resource: "machinemigrations"}, "m", errors.New("no")), false, ""},
		{"API server rate limit", apierrors.NewTooManyRequests("slow down", 1), false, ""},
		{"429 with another cause", otherCause, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			why, ok := IsDisruptionRefusal(tc.err)
			if ok != tc.wantOK || why != tc.wantWhy {
				t.Errorf("IsDisruptionRefusal = %q, %v; want %q, %v", why, ok, tc.wantWhy, tc.wantOK)
			}
		})
	}
	if refusal.ErrStatus.Reason != metav1.StatusReasonTooManyRequests || !apierrors.IsTooManyRequests(refusal) {
		t.Errorf("refusal is not a 429 TooManyRequests: %+v", refusal.ErrStatus)
	}
}
