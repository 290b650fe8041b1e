package controller

import (
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// testScheme knows the core and the Kairon kinds, for fake clients.
func testScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := kaironv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	return scheme
}

// recordedEvents takes the events r holds, oldest first, each as
// "<type> <reason> <note>".
func recordedEvents(r *events.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-r.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}
