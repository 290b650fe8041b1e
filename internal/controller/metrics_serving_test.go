package controller

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/zyvor/kairon/internal/testenv"
)

func TestMetricsServingOptions(t *testing.T) {
	plain := MetricsServing{BindAddress: ":8080"}.Options()
	if plain.SecureServing || plain.FilterProvider != nil || plain.BindAddress != ":8080" {
		t.Errorf("plain metrics: %+v", plain)
	}
	secure := MetricsServing{BindAddress: ":8443", Secure: true, CertDir: "/certs"}.Options()
	if !secure.SecureServing || secure.FilterProvider == nil || secure.CertDir != "/certs" {
		t.Errorf("secure metrics: SecureServing %v, filter set %v, CertDir %q", secure.SecureServing, secure.FilterProvider != nil, secure.CertDir)
	}
}

// Secure metrics serving as a scraper meets it: HTTPS, no answer without a
// token, 403 for a token whose user may not get /metrics, the metrics for
// one that may.
func TestSecureMetricsNeedAnAuthorizedToken(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	port := freePort(t)
	startControllers(t, env, ns, Options{}, func(o *ctrl.Options) {
		o.Metrics = MetricsServing{BindAddress: "127.0.0.1:" + strconv.Itoa(port), Secure: true}.Options()
	})

	clientset, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	token := func(sa string) string {
		if err := env.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa}}); err != nil {
			t.Fatal(err)
		}
		tr, err := clientset.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("token for %s: %v", sa, err)
		}
		return tr.Status.Token
	}
	scraper, nobody := token("scraper"), token("nobody")
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-metrics-reader"},
		Rules:      []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-metrics-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "scraper"}},
	}
	for _, o := range []client.Object{role, binding} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := env.Client.Delete(context.Background(), o); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("deleting %s: %v", o.GetName(), err)
			}
		})
	}

	// The certificate is self-signed: a scraper skips verification, as it
	// does for kube-controller-manager's default one.
	httpClient := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	get := func(scheme, bearer string) (int, string, error) {
		req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("%s://127.0.0.1:%d/metrics", scheme, port), nil)
		if err != nil {
			return 0, "", err
		}
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := httpClient.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), err
	}
	eventually(t, "the authorized scraper to get the metrics", func() (bool, string) {
		code, body, err := get("https", scraper)
		if err != nil {
			return false, err.Error()
		}
		return code == http.StatusOK && strings.Contains(body, "controller_runtime_reconcile_total"), fmt.Sprintf("%d %.200s", code, body)
	})
	if code, _, err := get("https", ""); err != nil || code != http.StatusUnauthorized {
		t.Errorf("no token: got %d %v, want 401", code, err)
	}
	// controller-runtime's filter answers 500 when the TokenReview itself
	// reports an error, as it does for a token that is not a JWT at all.
	if code, body, err := get("https", "not-a-token"); err != nil || (code != http.StatusUnauthorized && code != http.StatusInternalServerError) || strings.Contains(body, "controller_runtime_") {
		t.Errorf("a made-up token: got %d %v (%.100s), want 401 or 500 and no metrics", code, err, body)
	}
	if code, body, err := get("https", nobody); err != nil || code != http.StatusForbidden || strings.Contains(body, "controller_runtime_") {
		t.Errorf("a valid token without get /metrics: got %d %v (%.100s), want 403 and no metrics", code, err, body)
	}
	if code, _, err := get("http", scraper); err == nil && code == http.StatusOK {
		t.Errorf("plain HTTP served the metrics")
	}
}
