package confinement_test

import (
	"context"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/zyvor/kairon/internal/controlplane"
)

// TestWhoMayReadConsoles asks the API server the question a node agent's
// console server asks for each request (SubjectAccessReview, get
// machines/console): the API server's node proxy identity may, so that
// `kaironctl logs` through the proxy works; node agents, the controller
// and an ordinary user may not.
func TestWhoMayReadConsoles(t *testing.T) {
	cp := controlPlane(t)
	cs := kubernetes.NewForConfigOrDie(cp.RESTConfig())
	for _, c := range []struct {
		user   string
		groups []string
		want   bool
	}{
		{controlplane.APIServerKubeletClientUser, nil, true},
		{"kairon-admin", []string{"system:masters"}, true},
		{controlplane.NodeUserPrefix + "node-1", []string{controlplane.NodesGroup}, false},
		{controlplane.ControllerUser, []string{controlplane.ControllersGroup}, false},
		{"tenant", []string{"system:authenticated"}, false},
	} {
		review, err := cs.AuthorizationV1().SubjectAccessReviews().Create(context.Background(), &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{
				User: c.user, Groups: c.groups,
				ResourceAttributes: &authorizationv1.ResourceAttributes{
					Namespace: "team-a", Verb: "get", Group: "kairon.zyvor.dev", Resource: "machines", Subresource: "console", Name: "m",
				},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if review.Status.Allowed != c.want {
			t.Errorf("%s may get machines/console: %v, want %v (%s)", c.user, review.Status.Allowed, c.want, review.Status.Reason)
		}
	}
}
