package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	authenticationclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/images"
)

// PullCredentialsPath is where the webhook server hands node agents the
// pull secrets of their Machines (PullCredentialsHandler).
const PullCredentialsPath = "/pull-credentials"

// NodeNameExtra is the user extra in which the API server names the node
// of the Pod a ServiceAccount token is bound to.
const NodeNameExtra = "authentication.kubernetes.io/node-name"

// maxPullCredentialsBytes bounds the docker configs of one answer: a
// Secret holds at most 1 MiB, and a Machine has little use for more than
// a few.
const maxPullCredentialsBytes = 4 << 20

// PullCredentials is the answer of PullCredentialsPath: the docker
// configs of the Machine's spec.imagePullSecrets, in order (the
// .dockerconfigjson or .dockercfg value of each Secret).
type PullCredentials struct {
	DockerConfigs [][]byte `json:"dockerConfigs"`
}

// PullCredentialsHandler serves the node agents of a deployment where they
// share one ServiceAccount (the Helm chart): RBAC cannot grant each its
// own Machines' Secrets, as NodePullSecretsReconciler does for agents with
// a user of their own, because all of them are the same user to RBAC.
// The API server does tell them apart, by the node of the Pod their token
// is bound to (the user extra NodeNameExtra), and so does this handler:
// it reviews the caller's bearer token and hands it the pull secrets of a
// Machine only if the Machine is placed on the caller's node or is
// migrating to it, the nodes NodePullSecretsReconciler grants.
//
// Answers: 200 with PullCredentials; 401 for a missing or invalid token;
// 403 for a caller that is no node agent, or not that Machine's; 404 for a
// missing Machine or Secret (the node retries: it may come); 422 for a
// Secret that is not a docker config (the node gives up); 5xx when the API
// server could not be asked. Nothing is cached: each request reads the
// Machine and the Secrets from the API server, so a Machine that moved
// away is refused at once. Secret data is never logged.
type PullCredentialsHandler struct {
	// Reader reads Machines and Secrets from the API server.
	Reader client.Reader
	// Tokens reviews the callers' bearer tokens.
	Tokens authenticationclient.TokenReviewInterface
	// NodeServiceAccount is the user of the node agents' shared
	// ServiceAccount (system:serviceaccount:<ns>:<name>); "" when there is
	// none, and only kairon:node:<node> users are node agents.
	NodeServiceAccount string
}

// NodeOfUser is the node a node agent's user names, as the admission
// policies decide it (config/admission/node-confinement-*.yaml, variable
// nodeName): kairon:node:<node>, or nodeServiceAccount with exactly one
// NodeNameExtra. "" for any other user.
func NodeOfUser(user authenticationv1.UserInfo, nodeServiceAccount string) string {
	if node, ok := strings.CutPrefix(user.Username, nodeUserPrefix); ok {
		return node
	}
	if nodeServiceAccount != "" && user.Username == nodeServiceAccount {
		if names := user.Extra[NodeNameExtra]; len(names) == 1 {
			return names[0]
		}
	}
	return ""
}

// ServeHTTP answers GET ?namespace=NS&machine=NAME.
func (h *PullCredentialsHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	logger := log.FromContext(ctx).WithName("pull-credentials")
	code, body, caller := h.serve(ctx, r)
	pullCredentialRequests.WithLabelValues(strconv.Itoa(code)).Inc()
	if code != http.StatusOK {
		logger.V(1).Info("refused", "user", caller, "namespace", r.URL.Query().Get("namespace"), "machine", r.URL.Query().Get("machine"), "code", code, "reason", string(body))
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(code)
		_, _ = w.Write(append(body, '\n'))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(body)
}

// serve is the answer's status code and body, and the caller's user name
// for the log.
func (h *PullCredentialsHandler) serve(ctx context.Context, r *http.Request) (int, []byte, string) {
	if r.Method != http.MethodGet {
		return http.StatusMethodNotAllowed, []byte("only GET"), ""
	}
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || token == "" {
		return http.StatusUnauthorized, []byte("a bearer token is required"), ""
	}
	review, err := h.Tokens.Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	if err != nil {
		return http.StatusServiceUnavailable, fmt.Appendf(nil, "reviewing the bearer token: %v", err), ""
	}
	if !review.Status.Authenticated {
		return http.StatusUnauthorized, []byte("the bearer token is not valid"), ""
	}
	user := review.Status.User.Username
	node := NodeOfUser(review.Status.User, h.NodeServiceAccount)
	if node == "" {
		return http.StatusForbidden, fmt.Appendf(nil, "user %s is not a node agent whose credentials name a node", user), user
	}
	q := r.URL.Query()
	namespace, name := q.Get("namespace"), q.Get("machine")
	for _, p := range []struct{ param, value string }{{"namespace", namespace}, {"machine", name}} {
		if errs := validation.IsDNS1123Subdomain(p.value); len(errs) > 0 {
			return http.StatusBadRequest, fmt.Appendf(nil, "query parameter %s %q: %s", p.param, p.value, strings.Join(errs, "; ")), user
		}
	}
	machine := &kaironv1.Machine{}
	if err := h.Reader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, machine); err != nil {
		if apierrors.IsNotFound(err) {
			return http.StatusNotFound, fmt.Appendf(nil, "machine %s/%s does not exist", namespace, name), user
		}
		return http.StatusServiceUnavailable, fmt.Appendf(nil, "reading machine %s/%s: %v", namespace, name, err), user
	}
	target := machine.Annotations[kaironv1.AnnotationMachineMigrationTarget]
	if machine.Spec.NodeName != node && target != node {
		return http.StatusForbidden, fmt.Appendf(nil, "node agent of %s may not read the pull secrets of machine %s/%s: it is placed on %q and migrates to %q",
			node, namespace, name, machine.Spec.NodeName, target), user
	}
	var answer PullCredentials
	size := 0
	for i, ref := range machine.Spec.ImagePullSecrets {
		config, code, err := h.dockerConfig(ctx, namespace, i, ref.Name)
		if err != nil {
			return code, []byte(err.Error()), user
		}
		if size += len(config); size > maxPullCredentialsBytes {
			return http.StatusUnprocessableEntity, fmt.Appendf(nil, "spec.imagePullSecrets of machine %s/%s hold more than %d bytes of docker configs", namespace, name, maxPullCredentialsBytes), user
		}
		answer.DockerConfigs = append(answer.DockerConfigs, config)
	}
	body, err := json.Marshal(answer)
	if err != nil {
		return http.StatusInternalServerError, []byte(err.Error()), user
	}
	return http.StatusOK, body, user
}

// dockerConfig is the docker config of spec.imagePullSecrets[i], or why
// not with the status code to answer.
func (h *PullCredentialsHandler) dockerConfig(ctx context.Context, namespace string, i int, name string) ([]byte, int, error) {
	field := fmt.Sprintf("spec.imagePullSecrets[%d] %q", i, name)
	if name == "" {
		return nil, http.StatusUnprocessableEntity, fmt.Errorf("spec.imagePullSecrets[%d] names no secret", i)
	}
	secret := &corev1.Secret{}
	if err := h.Reader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, secret); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, http.StatusNotFound, fmt.Errorf("%s: secret %s/%s does not exist", field, namespace, name)
		}
		return nil, http.StatusServiceUnavailable, fmt.Errorf("%s: reading it: %w", field, err)
	}
	if config, _, ok := images.DockerConfigOf(secret); ok {
		return config, 0, nil
	}
	return nil, http.StatusUnprocessableEntity, fmt.Errorf("%s is of type %q; it must be %s", field, secret.Type, images.PullSecretTypes)
}
