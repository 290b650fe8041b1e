package node

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"k8s.io/client-go/rest"

	"github.com/zyvor/kairon/internal/node/imagepull"
)

// Where node agents share one ServiceAccount (the Helm chart), RBAC cannot
// let each read only its own Machines' pull secrets, so the agent asks
// kairon-controller for them (internal/controller/pull_credentials.go),
// which knows the agent's node by its Pod-bound token. Only an answer 422
// (a Secret that can never serve: wrong type) fails a pull for good; a
// refusal, a missing Machine or Secret, or an unreachable controller is
// retried, as a Secret the agent may not read yet is on the RBAC path.

// maxPullCredentialsAnswer bounds what the agent reads of an answer: the
// controller sends at most 4 MiB of configs, base64 in JSON.
const maxPullCredentialsAnswer = 6 << 20

// PullCredentialsClient asks kairon-controller for a Machine's pull
// secrets.
type PullCredentialsClient struct {
	url   *url.URL
	http  *http.Client
	token func() (string, error)
}

// NewPullCredentialsClient asks the endpoint at rawURL (https, the path
// included), trusting the CA certificates of the PEM file caFile ("": the
// system's), with the bearer token of cfg: cfg.BearerTokenFile re-read at
// each request (projected tokens rotate), else cfg.BearerToken.
func NewPullCredentialsClient(rawURL, caFile string, cfg *rest.Config) (*PullCredentialsClient, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("pull credentials URL %q: want https://host[:port]/path", rawURL)
	}
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("pull credentials CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("pull credentials CA %s: no PEM certificate in it", caFile)
		}
		tlsConfig.RootCAs = pool
	}
	tokenFile, token := cfg.BearerTokenFile, cfg.BearerToken
	if tokenFile == "" && token == "" {
		return nil, errors.New("pull credentials: the agent's API server credentials have no bearer token (a ServiceAccount token is needed)")
	}
	return &PullCredentialsClient{
		url: u,
		http: &http.Client{
			Timeout:   30 * time.Second,
			Transport: &http.Transport{TLSClientConfig: tlsConfig, Proxy: nil, ForceAttemptHTTP2: true},
			// The token must go to the controller only.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		token: func() (string, error) {
			if tokenFile == "" {
				return token, nil
			}
			data, err := os.ReadFile(tokenFile)
			if err != nil {
				return "", fmt.Errorf("reading the agent's token: %w", err)
			}
			return strings.TrimSpace(string(data)), nil
		},
	}, nil
}

// Fetch returns the docker configs of Machine namespace/name's
// spec.imagePullSecrets, in order. Every error but a 422 answer is an
// imagepull.TransientError.
func (c *PullCredentialsClient) Fetch(ctx context.Context, namespace, name string) ([][]byte, error) {
	token, err := c.token()
	if err != nil {
		return nil, imagepull.TransientError{Err: err}
	}
	u := *c.url
	u.RawQuery = url.Values{"namespace": {namespace}, "machine": {name}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, imagepull.TransientError{Err: fmt.Errorf("asking kairon-controller for the pull secrets: %w", err)}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxPullCredentialsAnswer+1))
	if err != nil {
		return nil, imagepull.TransientError{Err: fmt.Errorf("reading kairon-controller's pull secrets: %w", err)}
	}
	if len(body) > maxPullCredentialsAnswer {
		return nil, fmt.Errorf("kairon-controller's pull secrets answer is over %d bytes", maxPullCredentialsAnswer)
	}
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusUnprocessableEntity:
		return nil, errors.New(answerText(body))
	default:
		return nil, imagepull.TransientError{Err: fmt.Errorf("kairon-controller refused the pull secrets (%s): %s", resp.Status, answerText(body))}
	}
	var answer struct {
		DockerConfigs [][]byte `json:"dockerConfigs"`
	}
	if err := json.Unmarshal(body, &answer); err != nil {
		return nil, imagepull.TransientError{Err: fmt.Errorf("kairon-controller's pull secrets answer: %w", err)}
	}
	return answer.DockerConfigs, nil
}

// answerText is an error answer's text, cut short: it is shown in
// the Machine's status.
func answerText(body []byte) string {
	text := strings.TrimSpace(strings.ToValidUTF8(string(body), "?"))
	if len(text) > 512 {
		text = text[:512] + "..."
	}
	return text
}
