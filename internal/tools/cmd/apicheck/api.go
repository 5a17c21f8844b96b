package main

// The API walker: one line per exported name of a type-checked package, in
// the format of Go's own api/*.txt files (see $GOROOT/src/cmd/api), with
// these differences:
//   - an interface's type set is written too (Go's tool writes
//     "type DB interface {}" for "type DB interface{ *sql.DB | *pgxpool.Pool }");
//   - struct and interface types written inline (a field's, a parameter's)
//     list their exported fields and their methods with signatures, where Go's
//     tool writes only "struct" and the method names;
//   - exported fields promoted through an unexported embedded struct are
//     listed as the outer type's fields (methods promoted that way are in the
//     outer type's method set, as in Go's tool);
//   - one build context only (linux/amd64, set by the loader), where Go's
//     tool walks several.

import (
	"fmt"
	"go/ast"
	"go/token"
	"go/types"
	"slices"
	"strings"
)

// apiLines returns the sorted, de-duplicated API lines of pkg. files are its
// parsed files, read for "Deprecated:" notes (nil: no notes).
func apiLines(pkg *types.Package, files []*ast.File) []string {
	w := &walker{pkg: pkg, features: map[string]bool{}, deprecated: deprecatedPositions(files)}
	scope := pkg.Scope()
	for _, name := range scope.Names() { // sorted
		obj := scope.Lookup(name)
		if !obj.Exported() {
			continue
		}
		w.emitObj(obj)
	}
	lines := make([]string, 0, len(w.features))
	for f := range w.features {
		lines = append(lines, f)
	}
	slices.Sort(lines)
	return lines
}

type walker struct {
	pkg        *types.Package
	scope      []string
	features   map[string]bool
	deprecated map[token.Pos]bool
}

func (w *walker) emitf(format string, args ...any) {
	parts := append([]string{"pkg " + w.pkg.Path()}, w.scope...)
	parts = append(parts, fmt.Sprintf(format, args...))
	line := strings.Join(parts, ", ")
	if strings.Contains(line, "\n") {
		panic("API line contains a newline: " + line)
	}
	w.features[line] = true
}

func (w *walker) isDeprecated(obj types.Object) bool { return w.deprecated[obj.Pos()] }

func (w *walker) emitObj(obj types.Object) {
	switch obj := obj.(type) {
	case *types.Const:
		if w.isDeprecated(obj) {
			w.emitf("const %s //deprecated", obj.Name())
		}
		w.emitf("const %s %s", obj.Name(), w.typeString(obj.Type()))
		short, exact := obj.Val().String(), obj.Val().ExactString()
		if short == exact {
			w.emitf("const %s = %s", obj.Name(), short)
		} else {
			w.emitf("const %s = %s  // %s", obj.Name(), short, exact)
		}
	case *types.Var:
		if w.isDeprecated(obj) {
			w.emitf("var %s //deprecated", obj.Name())
		}
		w.emitf("var %s %s", obj.Name(), w.typeString(obj.Type()))
	case *types.TypeName:
		w.emitType(obj)
	case *types.Func:
		if w.isDeprecated(obj) {
			w.emitf("func %s //deprecated", obj.Name())
		}
		w.emitf("func %s%s", obj.Name(), w.signatureString(obj.Type().(*types.Signature)))
	default:
		panic(fmt.Sprintf("unknown object %T: %v", obj, obj))
	}
}

func (w *walker) emitType(obj *types.TypeName) {
	name := obj.Name()
	if w.isDeprecated(obj) {
		w.emitf("type %s //deprecated", name)
	}
	if obj.IsAlias() {
		if a, ok := obj.Type().(*types.Alias); ok && a.TypeParams().Len() > 0 {
			var b strings.Builder
			b.WriteString(name)
			w.writeTypeParams(&b, a.TypeParams(), true)
			name = b.String()
			w.emitf("type %s = %s", name, w.typeString(a.Rhs()))
			return
		}
		w.emitf("type %s = %s", name, w.typeString(obj.Type()))
		return
	}
	named := obj.Type().(*types.Named)
	if tps := named.TypeParams(); tps.Len() > 0 {
		var b strings.Builder
		b.WriteString(name)
		w.writeTypeParams(&b, tps, true)
		name = b.String()
	}
	switch u := named.Underlying().(type) {
	case *types.Struct:
		w.emitStruct(name, named, u)
	case *types.Interface:
		w.emitInterface(name, u)
		return // its methods are in emitInterface's lines
	default:
		w.emitf("type %s %s", name, w.typeString(u))
	}

	// Methods: the value method set first, then what only *T adds. Methods
	// promoted from embedded fields (exported or not) are included, with
	// the outer type as receiver.
	seen := map[string]bool{}
	for _, t := range []types.Type{named, types.NewPointer(named)} {
		ms := types.NewMethodSet(t)
		for i := range ms.Len() {
			m := ms.At(i)
			if !m.Obj().Exported() || seen[m.Obj().Name()] {
				continue
			}
			seen[m.Obj().Name()] = true
			w.emitMethod(named, m)
		}
	}
}

func (w *walker) emitStruct(name string, named *types.Named, st *types.Struct) {
	head := fmt.Sprintf("type %s struct", name)
	w.emitf("%s", head)
	w.scope = append(w.scope, head)
	defer func() { w.scope = w.scope[:len(w.scope)-1] }()
	for i := range st.NumFields() {
		f := st.Field(i)
		if !f.Exported() {
			if f.Anonymous() {
				w.emitPromotedFields(named, f, map[*types.Var]bool{})
			}
			continue
		}
		w.emitField(f)
	}
}

func (w *walker) emitField(f *types.Var) {
	if f.Anonymous() {
		if w.isDeprecated(f) {
			w.emitf("embedded %s //deprecated", w.typeString(f.Type()))
		}
		w.emitf("embedded %s", w.typeString(f.Type()))
		return
	}
	if w.isDeprecated(f) {
		w.emitf("%s //deprecated", f.Name())
	}
	w.emitf("%s %s", f.Name(), w.typeString(f.Type()))
}

// emitPromotedFields lists the exported fields reachable from outer through
// the unexported embedded field emb (and further unexported embedded fields
// of its type), those that the selector outer.Name really selects.
func (w *walker) emitPromotedFields(outer *types.Named, emb *types.Var, visited map[*types.Var]bool) {
	if visited[emb] {
		return
	}
	visited[emb] = true
	t := emb.Type()
	if p, ok := types.Unalias(t).(*types.Pointer); ok {
		t = p.Elem()
	}
	st, ok := t.Underlying().(*types.Struct)
	if !ok {
		return
	}
	for i := range st.NumFields() {
		f := st.Field(i)
		if !f.Exported() {
			if f.Anonymous() {
				w.emitPromotedFields(outer, f, visited)
			}
			continue
		}
		if obj, _, _ := types.LookupFieldOrMethod(outer, false, w.pkg, f.Name()); obj == f {
			w.emitField(f)
		}
	}
}

func (w *walker) emitInterface(name string, it *types.Interface) {
	head := "type " + name + " interface"
	w.scope = append(w.scope, head)
	var names []string
	complete := true
	ms := types.NewMethodSet(it)
	for i := range ms.Len() {
		m := ms.At(i).Obj().(*types.Func)
		if !m.Exported() {
			complete = false
			continue
		}
		names = append(names, m.Name())
		if w.isDeprecated(m) {
			w.emitf("%s //deprecated", m.Name())
		}
		w.emitf("%s%s", m.Name(), w.signatureString(m.Type().(*types.Signature)))
	}
	if !complete {
		// Only this package can implement it: record that, not the names.
		w.emitf("unexported methods")
	}
	w.scope = w.scope[:len(w.scope)-1]
	if !complete {
		return
	}
	elems := strings.Join(names, ", ")
	if terms := w.typeSetTerms(it); len(terms) > 0 {
		if elems != "" {
			elems += "; "
		}
		elems += strings.Join(terms, "; ")
	}
	if elems == "" {
		w.emitf("%s {}", head)
		return
	}
	w.emitf("%s { %s }", head, elems)
}

// typeSetTerms returns the sorted type-set restrictions of an interface:
// unions ("~int | ~string", terms sorted), single types and comparable, including those
// of embedded interfaces. Methods are not included.
func (w *walker) typeSetTerms(it *types.Interface) []string {
	var list []string
	for i := range it.NumEmbeddeds() {
		switch e := it.EmbeddedType(i).(type) {
		case *types.Union:
			terms := make([]string, e.Len()) // sorted: their order means nothing
			for j := range e.Len() {
				terms[j] = w.typeString(e.Term(j).Type())
				if e.Term(j).Tilde() {
					terms[j] = "~" + terms[j]
				}
			}
			slices.Sort(terms)
			list = append(list, strings.Join(terms, " | "))
		default:
			if n, ok := types.Unalias(e).(*types.Named); ok && n.Obj().Pkg() == nil && n.Obj().Name() == "comparable" {
				list = append(list, "comparable")
			} else if inner, ok := e.Underlying().(*types.Interface); ok {
				list = append(list, w.typeSetTerms(inner)...)
			} else {
				list = append(list, w.typeString(e))
			}
		}
	}
	slices.Sort(list)
	return slices.Compact(list)
}

func (w *walker) emitMethod(named *types.Named, m *types.Selection) {
	sig := m.Type().(*types.Signature)
	recv := w.typeString(named)
	if tps := named.TypeParams(); tps.Len() > 0 {
		var b strings.Builder
		w.writeTypeParams(&b, tps, false)
		recv += b.String()
	}
	if _, ptr := sig.Recv().Type().(*types.Pointer); ptr {
		recv = "*" + recv
	}
	if w.isDeprecated(m.Obj()) {
		w.emitf("method (%s) %s //deprecated", recv, m.Obj().Name())
	}
	w.emitf("method (%s) %s%s", recv, m.Obj().Name(), w.signatureString(sig))
}

func (w *walker) typeString(t types.Type) string {
	var b strings.Builder
	w.writeType(&b, t)
	return b.String()
}

func (w *walker) signatureString(sig *types.Signature) string {
	var b strings.Builder
	w.writeSignature(&b, sig)
	return b.String()
}

func (w *walker) writeType(b *strings.Builder, t types.Type) {
	switch t := t.(type) {
	case *types.Basic:
		s := t.Name()
		switch t.Kind() {
		case types.UnsafePointer:
			s = "unsafe.Pointer"
		case types.UntypedBool:
			s = "ideal-bool"
		case types.UntypedInt:
			s = "ideal-int"
		case types.UntypedRune:
			s = "ideal-char" // Go's tool's name
		case types.UntypedFloat:
			s = "ideal-float"
		case types.UntypedComplex:
			s = "ideal-complex"
		case types.UntypedString:
			s = "ideal-string"
		case types.Byte:
			s = "uint8"
		case types.Rune:
			s = "int32"
		}
		b.WriteString(s)
	case *types.Array:
		fmt.Fprintf(b, "[%d]", t.Len())
		w.writeType(b, t.Elem())
	case *types.Slice:
		b.WriteString("[]")
		w.writeType(b, t.Elem())
	case *types.Pointer:
		b.WriteByte('*')
		w.writeType(b, t.Elem())
	case *types.Map:
		b.WriteString("map[")
		w.writeType(b, t.Key())
		b.WriteByte(']')
		w.writeType(b, t.Elem())
	case *types.Chan:
		switch t.Dir() {
		case types.SendOnly:
			b.WriteString("chan<- ")
		case types.RecvOnly:
			b.WriteString("<-chan ")
		default:
			b.WriteString("chan ")
		}
		w.writeType(b, t.Elem())
	case *types.Signature:
		b.WriteString("func")
		w.writeSignature(b, t)
	case *types.Struct:
		var elems []string
		for i := range t.NumFields() {
			f := t.Field(i)
			if !f.Exported() {
				continue
			}
			if f.Anonymous() {
				elems = append(elems, w.typeString(f.Type()))
			} else {
				elems = append(elems, f.Name()+" "+w.typeString(f.Type()))
			}
		}
		if len(elems) == 0 {
			b.WriteString("struct{}")
		} else {
			b.WriteString("struct{ " + strings.Join(elems, "; ") + " }")
		}
	case *types.Interface:
		var elems []string
		for i := range t.NumMethods() { // sorted by types.Interface
			m := t.Method(i)
			elems = append(elems, m.Name()+w.signatureString(m.Type().(*types.Signature)))
		}
		elems = append(elems, w.typeSetTerms(t)...)
		if len(elems) == 0 {
			b.WriteString("interface{}")
		} else {
			b.WriteString("interface{ " + strings.Join(elems, "; ") + " }")
		}
	case *types.Alias:
		w.writeType(b, types.Unalias(t))
	case *types.Named:
		obj := t.Obj()
		if pkg := obj.Pkg(); pkg != nil && pkg != w.pkg {
			b.WriteString(pkg.Name())
			b.WriteByte('.')
		}
		b.WriteString(obj.Name())
		if targs := t.TypeArgs(); targs.Len() > 0 {
			b.WriteByte('[')
			for i := range targs.Len() {
				if i > 0 {
					b.WriteString(", ")
				}
				w.writeType(b, targs.At(i))
			}
			b.WriteByte(']')
		}
	case *types.TypeParam:
		// Names of type parameters may change: write the index.
		fmt.Fprintf(b, "$%d", t.Index())
	case *types.Tuple, *types.Union:
		panic(fmt.Sprintf("unexpected %T", t))
	default:
		panic(fmt.Sprintf("unknown type %T", t))
	}
}

func (w *walker) writeSignature(b *strings.Builder, sig *types.Signature) {
	if tps := sig.TypeParams(); tps.Len() > 0 {
		w.writeTypeParams(b, tps, true)
	}
	w.writeParams(b, sig.Params(), sig.Variadic())
	switch res := sig.Results(); res.Len() {
	case 0:
	case 1:
		b.WriteByte(' ')
		w.writeType(b, res.At(0).Type())
	default:
		b.WriteByte(' ')
		w.writeParams(b, res, false)
	}
}

func (w *walker) writeTypeParams(b *strings.Builder, tps *types.TypeParamList, withConstraints bool) {
	b.WriteByte('[')
	for i := range tps.Len() {
		if i > 0 {
			b.WriteString(", ")
		}
		tp := tps.At(i)
		w.writeType(b, tp)
		if withConstraints {
			b.WriteByte(' ')
			w.writeType(b, tp.Constraint())
		}
	}
	b.WriteByte(']')
}

func (w *walker) writeParams(b *strings.Builder, t *types.Tuple, variadic bool) {
	b.WriteByte('(')
	for i := range t.Len() {
		if i > 0 {
			b.WriteString(", ")
		}
		typ := t.At(i).Type()
		if variadic && i == t.Len()-1 {
			b.WriteString("...")
			typ = typ.(*types.Slice).Elem()
		}
		w.writeType(b, typ)
	}
	b.WriteByte(')')
}

// deprecatedPositions returns the positions of the names whose doc comment
// has a paragraph starting "Deprecated:" (a declaration, a spec of a group,
// a field or an interface method).
func deprecatedPositions(files []*ast.File) map[token.Pos]bool {
	isDep := func(doc *ast.CommentGroup) bool {
		if doc == nil {
			return false
		}
		for _, para := range strings.Split(doc.Text(), "\n\n") {
			if strings.HasPrefix(para, "Deprecated:") {
				return true
			}
		}
		return false
	}
	dep := map[token.Pos]bool{}
	markNames := func(ids []*ast.Ident) {
		for _, id := range ids {
			dep[id.Pos()] = true
		}
	}
	for _, file := range files {
		ast.Inspect(file, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.File, *ast.StructType, *ast.InterfaceType, *ast.FieldList:
				return true
			case *ast.GenDecl:
				if isDep(n.Doc) {
					for _, spec := range n.Specs {
						switch spec := spec.(type) {
						case *ast.ValueSpec:
							markNames(spec.Names)
						case *ast.TypeSpec:
							dep[spec.Name.Pos()] = true
						}
					}
				}
				return true
			case *ast.FuncDecl:
				if isDep(n.Doc) {
					dep[n.Name.Pos()] = true
				}
				return false
			case *ast.TypeSpec:
				if isDep(n.Doc) {
					dep[n.Name.Pos()] = true
				}
				return true
			case *ast.ValueSpec:
				if isDep(n.Doc) {
					markNames(n.Names)
				}
				return false
			case *ast.Field:
				if isDep(n.Doc) {
					markNames(n.Names)
					if len(n.Names) == 0 { // embedded: T, *T, p.T, T[X]
						typ := n.Type
						if s, ok := typ.(*ast.StarExpr); ok {
							typ = s.X
						}
						switch x := typ.(type) {
						case *ast.IndexExpr:
							typ = x.X
						case *ast.IndexListExpr:
							typ = x.X
						}
						switch x := typ.(type) {
						case *ast.Ident:
							dep[x.Pos()] = true
						case *ast.SelectorExpr:
							dep[x.Sel.Pos()] = true
						}
					}
				}
				return false
			default:
				return false
			}
		})
	}
	return dep
}
