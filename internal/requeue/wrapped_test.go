package requeue

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// Every controller Kairon builds with controller-runtime's builder hands
// it a reconciler wrapped in AtNormalPriority: one left out would starve
// its timed work after a restart under load, and no test of its own would
// show it.
func TestEveryBuiltControllerRequeuesAtNormalPriority(t *testing.T) {
	fset := token.NewFileSet()
	built := 0
	for _, dir := range []string{"../controller", "../node"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, path := range files {
			if strings.HasSuffix(path, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok || sel.Sel.Name != "Complete" || len(call.Args) != 1 {
					return true
				}
				built++
				if !isCall(call.Args[0], "requeue", "AtNormalPriority") {
					t.Errorf("%s: Complete takes a reconciler not wrapped in requeue.AtNormalPriority", fset.Position(call.Pos()))
				}
				return true
			})
		}
	}
	if built < 20 {
		t.Errorf("found %d builder-made controllers in internal/controller and internal/node, want at least 20: is the search still looking in the right place?", built)
	}
}

func isCall(e ast.Expr, pkg, fn string) bool {
	call, ok := e.(*ast.CallExpr)
	if !ok {
		return false
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	id, ok := sel.X.(*ast.Ident)
	return ok && id.Name == pkg && sel.Sel.Name == fn
}
