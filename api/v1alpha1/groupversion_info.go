// Package v1alpha1 contains the kairon.zyvor.dev/v1alpha1 API: Machines and
// the objects that create, pool, move, confine and budget them.
//
// +kubebuilder:object:generate=true
// +groupName=kairon.zyvor.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the API group and version of every Kairon kind.
	GroupVersion = schema.GroupVersion{Group: "kairon.zyvor.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the Kairon kinds with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the Kairon kinds to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
