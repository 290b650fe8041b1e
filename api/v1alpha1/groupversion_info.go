package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the API group and version of every Kairon kind.
	GroupVersion = schema.GroupVersion{Group: "kairon.zyvor.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the Kairon kinds with a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the Kairon kinds to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// kinds are the objects of every Kairon kind, each *_types.go adding its own
// pair in init. The API package depends only on apimachinery, so clients
// import it without controller-runtime.
var kinds []runtime.Object

func register(objects ...runtime.Object) { kinds = append(kinds, objects...) }

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, kinds...)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
