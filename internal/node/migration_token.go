package node

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"

	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// One-time transfer tokens (issue 10, finding 2).
//
// The agent that connects to the migration listener (the source of a live
// migration; the target fetching a cold migration's saved state) mints a
// random token, publishes only its SHA-256 on the MachineMigration
// (annotation kairon.zyvor.dev/transfer-token-sha256) and presents the
// token on the connection, after the TLS handshake. The listening agent
// accepts it only if it hashes to the annotation, and consumes it by
// removing the annotation with an optimistic lock before it sends or
// takes anything: a replay, even with a valid certificate and a captured
// token, finds no hash, and of two connections racing with one token only
// one wins.
//
// Where the token lives: nowhere but in the connecting agent's memory and
// inside the TLS connection. Readers of the migration (users of its
// namespace, other nodes) see a hash of 256 random bits. Writing the
// annotation is what binds the connection to an identity the API server
// authenticated, on top of the node certificate: a node that is neither
// source nor target can neither publish a hash nor learn a token.

// transferTokenBytes is the token's entropy.
const transferTokenBytes = 32

// transferTokenLen is its length in unpadded base64url.
var transferTokenLen = base64.RawURLEncoding.EncodedLen(transferTokenBytes)

// newTransferToken mints a token and its hash for the annotation.
func newTransferToken() (token, hash string, err error) {
	b := make([]byte, transferTokenBytes)
	if _, err := rand.Read(b); err != nil {
		return "", "", err
	}
	token = base64.RawURLEncoding.EncodeToString(b)
	return token, tokenHash(token), nil
}

func tokenHash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// validTokenSyntax tells whether s can be a token: transferTokenLen
// characters of the base64url alphabet.
func validTokenSyntax(s string) bool {
	if len(s) != transferTokenLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// publishTransferToken mints a token for this agent's next connection for
// mig and puts its hash on the migration, replacing any earlier one.
func (a *Agent) publishTransferToken(ctx context.Context, mig *kaironv1.MachineMigration) (string, error) {
	token, hash, err := newTransferToken()
	if err != nil {
		return "", err
	}
	base := mig.DeepCopy()
	if mig.Annotations == nil {
		mig.Annotations = map[string]string{}
	}
	mig.Annotations[kaironv1.AnnotationMigrationTransferToken] = hash
	if err := a.client.Patch(ctx, mig, client.MergeFrom(base)); err != nil {
		return "", fmt.Errorf("publishing the transfer token of migration %s: %w", mig.Name, err)
	}
	return token, nil
}

// errTokenRefused is a token that is not (or no longer) the migration's.
var errTokenRefused = errors.New("transfer token not valid for this migration (wrong, or already used)")

// consumeTransferToken checks token against migration mig, read afresh,
// and removes its hash, so that it is accepted once. It returns the
// migration as written.
func (a *Agent) consumeTransferToken(ctx context.Context, mig *kaironv1.MachineMigration, token string) (*kaironv1.MachineMigration, error) {
	var consumed *kaironv1.MachineMigration
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		fresh := &kaironv1.MachineMigration{}
		if err := a.mgr.GetAPIReader().Get(ctx, client.ObjectKeyFromObject(mig), fresh); err != nil {
			return err
		}
		want := fresh.Annotations[kaironv1.AnnotationMigrationTransferToken]
		got := tokenHash(token)
		if fresh.UID != mig.UID || !validTokenSyntax(token) || len(want) != len(got) ||
			subtle.ConstantTimeCompare([]byte(want), []byte(got)) != 1 {
			return errTokenRefused
		}
		base := fresh.DeepCopy()
		delete(fresh.Annotations, kaironv1.AnnotationMigrationTransferToken)
		if err := a.client.Patch(ctx, fresh, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
			return err
		}
		consumed = fresh
		return nil
	})
	return consumed, err
}
