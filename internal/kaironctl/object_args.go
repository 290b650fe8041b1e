package kaironctl

import (
	"fmt"
	"strings"
)

// kindNames is one kind named on the command line and the names given of
// it; no names means every object of the kind.
type kindNames struct {
	kind  *Kind
	names []string
}

// parseObjectArgs reads the object arguments of get, describe, delete and
// scale the way kubectl reads them, so that what kaironctl prints
// (`-o name`, "machineclaim/job-42 bound ...") can be passed back to it:
//
//	KIND              every object of the kind
//	KIND,KIND...      every object of each kind
//	KIND NAME...      the named objects of one kind
//	KIND/NAME...      objects each named with its kind; the kinds may differ
//
// Kinds come out in the order first given, each once. args must not be
// empty: every verb says in its own words that it needs a KIND.
func parseObjectArgs(args []string) ([]kindNames, error) {
	if strings.Contains(args[0], "/") {
		var out []kindNames
		for _, arg := range args {
			k, name, ok, err := splitKindName(arg)
			switch {
			case !ok:
				return nil, fmt.Errorf("%q is not KIND/NAME", arg)
			case err != nil:
				return nil, err
			case k == nil:
				return nil, fmt.Errorf("%q is a bare NAME after %q: give every object as KIND/NAME, or one KIND and then NAMEs", arg, args[0])
			}
			out = withKind(out, k)
			last := &out[kindIndex(out, k)]
			last.names = append(last.names, name)
		}
		return out, nil
	}

	var out []kindNames
	for _, kindName := range strings.Split(args[0], ",") {
		if kindName == "" {
			return nil, fmt.Errorf("%q has an empty KIND; separate kinds with single commas, e.g. machines,machinepools", args[0])
		}
		k, err := lookupKind(kindName)
		if err != nil {
			return nil, err
		}
		out = withKind(out, k)
	}
	names := args[1:]
	for _, name := range names {
		if strings.Contains(name, "/") {
			return nil, fmt.Errorf("%q after the KIND %q: give either KIND NAME... or KIND/NAME..., not both", name, args[0])
		}
	}
	if len(names) > 0 {
		if len(out) > 1 {
			return nil, fmt.Errorf("NAMEs cannot follow a list of kinds (%q); name each object as KIND/NAME", args[0])
		}
		out[0].names = names
	}
	return out, nil
}

// splitKindName reads one argument that is a NAME or a KIND/NAME. k is
// nil for a bare NAME; ok is false for a malformed KIND/NAME (a part
// empty, a second slash), and err is lookupKind's for an unknown KIND.
func splitKindName(arg string) (k *Kind, name string, ok bool, err error) {
	kindName, name, found := strings.Cut(arg, "/")
	if !found {
		return nil, arg, true, nil
	}
	if kindName == "" || name == "" || strings.Contains(name, "/") {
		return nil, "", false, nil
	}
	k, err = lookupKind(kindName)
	return k, name, true, err
}

// named tells whether the arguments named objects rather than whole kinds
// (parseObjectArgs gives names to every kind or to none).
func named(groups []kindNames) bool { return len(groups[0].names) > 0 }

// withKind appends k unless groups already has it.
func withKind(groups []kindNames, k *Kind) []kindNames {
	if kindIndex(groups, k) >= 0 {
		return groups
	}
	return append(groups, kindNames{kind: k})
}

func kindIndex(groups []kindNames, k *Kind) int {
	for i := range groups {
		if groups[i].kind == k {
			return i
		}
	}
	return -1
}

// oneKindNamed reads the arguments of a verb that acts on named objects of
// one kind (describe, scale): KIND NAME... or KIND/NAME.... A list of kinds,
// or KIND/NAME arguments of several kinds, are refused in verb's words.
func oneKindNamed(verb string, args []string) (*Kind, []string, error) {
	groups, err := parseObjectArgs(args)
	if err != nil {
		return nil, nil, err
	}
	if len(groups) > 1 {
		kinds := make([]string, len(groups))
		for i, g := range groups {
			kinds[i] = g.kind.Resource
		}
		return nil, nil, fmt.Errorf("%s works on one kind at a time, got %s", verb, strings.Join(kinds, ", "))
	}
	return groups[0].kind, groups[0].names, nil
}
