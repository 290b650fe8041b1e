package ops

import kaironv1 "github.com/zyvor/kairon/api/v1alpha1"

// ParseStrategy is the migration strategy a user named: cold or live.
// Anything else, the empty string included, is not one; a caller with a
// default fills it in before, so that each keeps its own wording of the
// refusal.
func ParseStrategy(s string) (kaironv1.MigrationStrategy, bool) {
	switch st := kaironv1.MigrationStrategy(s); st {
	case kaironv1.MigrationCold, kaironv1.MigrationLive:
		return st, true
	}
	return "", false
}
