package rules

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

func TestIsKaironNode(t *testing.T) {
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   bool
	}{
		{"no labels", nil, false},
		{"other labels", map[string]string{"kubernetes.io/hostname": "n1"}, false},
		{"the label, empty value", map[string]string{kaironv1.LabelNode: ""}, true},
		{"the label", map[string]string{kaironv1.LabelNode: "true"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: tc.labels}}
			if got := IsKaironNode(n); got != tc.want {
				t.Errorf("IsKaironNode = %v, want %v", got, tc.want)
			}
		})
	}
}
