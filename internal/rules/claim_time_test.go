package rules

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

func TestClaimCreatedAt(t *testing.T) {
	created := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC) // creationTimestamp: whole seconds
	tests := []struct {
		name  string
		stamp string
		want  time.Time
		ok    bool
	}{
		{name: "no stamp"},
		{name: "within the creation second", stamp: "2026-12-02T12:00:00.900Z", want: created.Add(900 * time.Millisecond), ok: true},
		{name: "just before it (the client stamps before it sends)", stamp: "2026-12-02T11:59:59.950Z", want: created.Add(-50 * time.Millisecond), ok: true},
		{name: "another zone, same instant", stamp: "2026-12-02T13:00:00.250+01:00", want: created.Add(250 * time.Millisecond), ok: true},
		{name: "older than creationTimestamp allows", stamp: "2026-12-02T11:59:58.999Z"},
		{name: "later than creationTimestamp allows", stamp: "2026-12-02T12:00:02.000Z"},
		{name: "not a time", stamp: "yesterday"},
		{name: "empty", stamp: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &kaironv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(created)}}
			if tt.name != "no stamp" {
				c.Annotations = map[string]string{kaironv1.AnnotationClaimCreatedAt: tt.stamp}
			}
			got, ok := ClaimCreatedAt(c)
			if ok != tt.ok || !got.Equal(tt.want) {
				t.Errorf("ClaimCreatedAt = %v, %v; want %v, %v", got, ok, tt.want, tt.ok)
			}
		})
	}
}
