package kaironctl

import (
	"bytes"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// describe machinepool's text for each state a pool's image can be in.
func TestPrintPoolImage(t *testing.T) {
	const (
		ref = "127.0.0.1:5000/kairon/python:3.11"
		d1  = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
		d2  = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
	)
	now := time.Date(2026, 12, 8, 12, 0, 0, 0, time.UTC)
	resolvedAt := metav1.NewTime(now.Add(-5 * time.Minute))
	member := func(name, image, state string) kaironv1.Machine {
		return kaironv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{kaironv1.LabelMachinePool: "agents", kaironv1.LabelPoolState: state}},
			Spec:       kaironv1.MachineSpec{Image: image},
		}
	}
	gone := member("gone", ref+"@"+d1, kaironv1.PoolStateWarm)
	gone.DeletionTimestamp = &resolvedAt
	pool := func(image string, status *kaironv1.MachinePoolImage, conds ...metav1.Condition) *kaironv1.MachinePool {
		p := &kaironv1.MachinePool{ObjectMeta: metav1.ObjectMeta{Name: "agents", Generation: 2}}
		p.Spec.Template.Spec.Image = image
		p.Status.Image = status
		p.Status.Conditions = conds
		return p
	}
	tests := []struct {
		name    string
		pool    *kaironv1.MachinePool
		members []kaironv1.Machine
		want    string
	}{
		{
			name: "resolved; members on two digests after a restart",
			pool: pool(ref, &kaironv1.MachinePoolImage{Reference: ref, Digest: d2, TemplateHash: "5d9f8c7b6", ResolvedAt: &resolvedAt},
				metav1.Condition{Type: conditionImageResolved, Status: "True", Reason: "Resolved", ObservedGeneration: 2}),
			members: []kaironv1.Machine{
				member("a", ref+"@"+d2, kaironv1.PoolStateWarm), member("b", ref+"@"+d2, kaironv1.PoolStateWarm),
				member("c", ref+"@"+d1, kaironv1.PoolStateClaimed), gone,
			},
			want: `Image:            127.0.0.1:5000/kairon/python:3.11
Pinned digest:    ` + d2 + `
Resolved:         2026-12-08T11:55:00Z (5m ago), for template 5d9f8c7b6
New members run:  127.0.0.1:5000/kairon/python:3.11@` + d2 + `
Members by image:
  127.0.0.1:5000/kairon/python:3.11@` + d1 + `   0 warm, 1 claimed
  127.0.0.1:5000/kairon/python:3.11@` + d2 + `   2 warm, 0 claimed
`,
		},
		{
			name: "pinned by digest in the template",
			pool: pool(ref+"@"+d1, &kaironv1.MachinePoolImage{Reference: ref + "@" + d1, Digest: d1, TemplateHash: "h"}),
			want: `Image:            127.0.0.1:5000/kairon/python:3.11@` + d1 + `
Pinned digest:    ` + d1 + `
Resolved:         never asked: the reference is pinned by digest
New members run:  127.0.0.1:5000/kairon/python:3.11@` + d1 + `
Members: none
`,
		},
		{
			name: "not resolved",
			pool: pool(ref, nil, metav1.Condition{Type: conditionImageResolved, Status: "False", Reason: "ResolveFailed",
				Message: "resolving image " + ref + ": unauthorized:\nHEAD …: 401 Unauthorized"}),
			want: `Image:          127.0.0.1:5000/kairon/python:3.11
Pinned digest:  none yet: no member is created until there is one
ImageResolved:  False (ResolveFailed): resolving image 127.0.0.1:5000/kairon/python:3.11: unauthorized:; HEAD …: 401 Unauthorized
Members: none
`,
		},
		{
			name: "an earlier template's digest",
			pool: pool(ref, &kaironv1.MachinePoolImage{Reference: "127.0.0.1:5000/kairon/python:3.10", Digest: d1, TemplateHash: "h"}),
			want: `Image:            127.0.0.1:5000/kairon/python:3.11
Pinned digest:    ` + d1 + ` (of 127.0.0.1:5000/kairon/python:3.10, an earlier template: the pool is resolving the current one)
Resolved:         at an unknown time, for template h
New members run:  127.0.0.1:5000/kairon/python:3.10@` + d1 + `
Members: none
`,
		},
		{
			name:    "built in",
			pool:    pool("", nil),
			members: []kaironv1.Machine{member("a", "", kaironv1.PoolStateWarm)},
			want: `Image:  default (built in: nothing to pin)
Members by image:
  default   1 warm, 0 claimed
`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			if err := printPoolImage(&out, tt.pool, tt.members, now); err != nil {
				t.Fatal(err)
			}
			if out.String() != tt.want {
				t.Errorf("got:\n%s\nwant:\n%s", out.String(), tt.want)
			}
		})
	}
}
