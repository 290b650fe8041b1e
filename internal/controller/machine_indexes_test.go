package controller

import (
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// The indexes hold exactly what the label selectors they replace chose.
func TestMachineIndexes(t *testing.T) {
	machine := func(labels map[string]string) *kaironv1.Machine {
		return &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m", Labels: labels}}
	}
	tests := []struct {
		name             string
		labels           map[string]string
		wantPool, wantBy []string
	}{
		{"warm member", map[string]string{kaironv1.LabelMachinePool: "p", kaironv1.LabelPoolState: kaironv1.PoolStateWarm}, []string{"p"}, nil},
		{"claimed member", map[string]string{kaironv1.LabelMachinePool: "p", kaironv1.LabelPoolState: kaironv1.PoolStateClaimed,
			kaironv1.LabelMachineClaim: "c"}, []string{"p"}, []string{"c"}},
		{"a claim label on a warm member (handed back)", map[string]string{kaironv1.LabelMachinePool: "p", kaironv1.LabelPoolState: kaironv1.PoolStateWarm,
			kaironv1.LabelMachineClaim: "c"}, []string{"p"}, nil},
		{"claimed without a claim name", map[string]string{kaironv1.LabelPoolState: kaironv1.PoolStateClaimed}, nil, nil},
		{"no labels", nil, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := machine(tt.labels)
			if got := poolOfMember(m); !slices.Equal(got, tt.wantPool) {
				t.Errorf("pool index %v, want %v", got, tt.wantPool)
			}
			if got := claimOfClaimedMachine(m); !slices.Equal(got, tt.wantBy) {
				t.Errorf("claim index %v, want %v", got, tt.wantBy)
			}
		})
	}
}
