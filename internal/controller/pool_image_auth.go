package controller

import (
	"context"
	"fmt"
	"strings"
	"unicode"

	"github.com/google/go-containerregistry/pkg/authn"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/zyvor/kairon/internal/images"
)

// The credentials a pool resolves its template's image with: the
// docker-config Secrets its template's imagePullSecrets name, in the
// pool's namespace, as kubelet reads a Pod's. The controller reads each by
// name (get, never list or watch: it holds no other right on Secrets).
// Which credential goes to which registry is decided by the node's own
// keychain (images.KeychainFromDockerConfigs), so that the pool resolves a
// tag with exactly the credentials its members' nodes will pull it with.

// readPullSecrets reads the named Secrets of namespace ns into a keychain.
// A Secret that does not exist is left out and named in missing, as
// kubelet goes on without it (a public image needs none); one that exists
// but is no docker config is an error naming it and why.
func readPullSecrets(ctx context.Context, reader client.Reader, ns string, refs []corev1.LocalObjectReference) (keychain authn.Keychain, missing []string, err error) {
	var configs [][]byte
	for i, ref := range refs {
		if ref.Name == "" {
			continue
		}
		var s corev1.Secret
		if err := reader.Get(ctx, client.ObjectKey{Namespace: ns, Name: ref.Name}, &s); err != nil {
			if apierrors.IsNotFound(err) {
				missing = append(missing, ref.Name)
				continue
			}
			return nil, nil, fmt.Errorf("imagePullSecrets[%d] (secret %s): %w", i, ref.Name, err)
		}
		config, err := dockerConfigOf(&s)
		if err == nil {
			// Parsed alone first, so that an error names its Secret.
			_, err = images.KeychainFromDockerConfigs(config)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("imagePullSecrets[%d] (secret %s): %s", i, ref.Name, registryText(err.Error()))
		}
		configs = append(configs, config)
	}
	keychain, err = images.KeychainFromDockerConfigs(configs...)
	if err != nil {
		return nil, nil, fmt.Errorf("imagePullSecrets: %s", registryText(err.Error()))
	}
	return keychain, missing, nil
}

// dockerConfigOf is the docker config a pull secret holds
// (images.DockerConfigOf), or why it holds none.
func dockerConfigOf(s *corev1.Secret) ([]byte, error) {
	config, key, ok := images.DockerConfigOf(s)
	switch {
	case key == "":
		return nil, fmt.Errorf("its type is %q, not %s or %s", s.Type, corev1.SecretTypeDockerConfigJson, corev1.SecretTypeDockercfg)
	case !ok:
		return nil, fmt.Errorf("it has no %s", key)
	}
	return config, nil
}

// registryText is s with control characters replaced by spaces, at most
// 512 bytes: a secret's keys are the user's text, on their way into a
// status and an event.
func registryText(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
	return truncate(strings.Join(strings.Fields(s), " "), 512)
}
