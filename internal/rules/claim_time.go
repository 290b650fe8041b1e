package rules

import (
	"time"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// ClaimStampSkew is how far a client's clock may be off the API server's for
// its creation stamp (AnnotationClaimCreatedAt) to be believed.
const ClaimStampSkew = time.Second

// ClaimStampFormat is how clients write AnnotationClaimCreatedAt.
const ClaimStampFormat = "2006-01-02T15:04:05.000Z07:00"

// ClaimCreatedAt is the creation time a claim's client stamped on it, if
// creationTimestamp allows it. The API server truncates creationTimestamp
// to the second, so the claim was created in [creationTimestamp,
// creationTimestamp+1s); a client stamps just before it sends, so its stamp
// is a little earlier than that. A stamp outside that second, widened by
// ClaimStampSkew either way, would claim a bind slower or faster than the
// API server can have seen, and is not believed.
func ClaimCreatedAt(c *kaironv1.MachineClaim) (time.Time, bool) {
	raw, ok := c.Annotations[kaironv1.AnnotationClaimCreatedAt]
	if !ok {
		return time.Time{}, false
	}
	stamp, err := time.Parse(time.RFC3339Nano, raw)
	if err != nil {
		return time.Time{}, false
	}
	created := c.CreationTimestamp.Time
	if created.IsZero() || stamp.Before(created.Add(-ClaimStampSkew)) || !stamp.Before(created.Add(time.Second+ClaimStampSkew)) {
		return time.Time{}, false
	}
	return stamp, true
}
