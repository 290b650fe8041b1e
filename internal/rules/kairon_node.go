package rules

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// IsKaironNode tells whether o, a Node, was registered by a Kairon agent:
// it carries the kairon.zyvor.dev/node label. Only such nodes run
// Machines; the cluster's other nodes are left alone.
func IsKaironNode(o metav1.Object) bool {
	_, ok := o.GetLabels()[kaironv1.LabelNode]
	return ok
}
