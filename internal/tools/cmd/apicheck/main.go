// Command apicheck keeps the exported API of the repository's published
// modules in checked files, api/<module>.txt at the repository root, one line
// per exported name in the format of Go's own api/*.txt files:
//
//	pkg github.com/pglease/pglease, func New[$0 DB]($0, ...Option) (*Locker, error)
//	pkg github.com/pglease/pglease, method (*Lease) Unlock(context.Context) error
//	pkg github.com/pglease/pglease, type LeaseInfo struct, Key string
//
// Usage (from .ci/api, which runs it from internal/tools with GOWORK=off):
//
//	apicheck [-root DIR] [-check | -w]
//
// -check (the default) regenerates the files in memory and, on any
// difference, prints a diff and exits 1; -w rewrites them. Exit status 2 is a
// failure to load or type-check a package.
//
// # Which modules are published
//
// Every go.mod under the repository root, except:
//   - internal/tools: this module (the repository's own tools, never published);
//   - bench: the benchmark harness, a module so its requirements stay apart;
//   - e2e: the end-to-end browser tests, likewise;
//   - any go.mod under a directory named internal or testdata (not importable
//     from outside, or not Go code of the repository), or under a directory
//     the go command ignores (vendor, names starting with "." or "_").
//
// Edit excludedModuleDirs below to change the list.
//
// # Which packages
//
// In each published module, every package matched by ./... (the module's
// own, not nested modules') except main packages and packages with an
// internal path element. Packages are loaded with go/packages from the
// module's directory with GOWORK set to the repository's go.work (so the
// modules resolve each other as in the workspace) when the module is one of
// its "use" entries, and GOWORK=off otherwise; always for GOOS=linux,
// GOARCH=amd64, so the files do not depend on the machine.
//
// # Which file
//
// api/<dir>.txt, where <dir> is the module's directory relative to the root
// with "/" replaced by "-" (contrib/cron: api/contrib-cron.txt), and the root
// module's file is named after the last element of its path (api/pglease.txt).
// A module with no exported names (only main packages, say) has no file;
// any other .txt file in api/ is stale: -check reports it, -w removes it.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/mod/modfile"
	"golang.org/x/tools/go/packages"
)

// excludedModuleDirs are the module directories (relative to the repository
// root, slash-separated) that are not published; see the package comment.
var excludedModuleDirs = []string{
	"internal/tools", // this module: the repository's tools
	"bench",          // benchmark harness
	"e2e",            // end-to-end browser tests
}

// skippedDirNames are directory names under which no published module is
// looked for.
var skippedDirNames = []string{"internal", "testdata", "vendor"}

const apiDir = "api"

func main() {
	root := flag.String("root", "", "repository root (default: the nearest directory up from here with a go.work or .git)")
	write := flag.Bool("w", false, "rewrite the api files")
	check := flag.Bool("check", false, "compare the api files with the code (the default)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: apicheck [-root DIR] [-check | -w]\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 || (*write && *check) {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(*root, *write); err != nil {
		if errors.Is(err, errChanged) {
			fmt.Fprintln(os.Stderr, "apicheck: the exported API changed: review the change, then run .ci/api -w to accept it")
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "apicheck:", err)
		os.Exit(2)
	}
}

var errChanged = errors.New("API changed")

func run(root string, write bool) error {
	if root == "" {
		r, err := findRoot()
		if err != nil {
			return err
		}
		root = r
	}
	root, err := filepath.Abs(root)
	if err != nil {
		return err
	}
	mods, err := publishedModules(root)
	if err != nil {
		return err
	}
	workspace, err := workspaceDirs(root)
	if err != nil {
		return err
	}
	want := map[string][]byte{} // file name in api/ → content
	for _, m := range mods {
		gowork := "off"
		if workspace[m.Dir] {
			gowork = filepath.Join(root, "go.work")
		}
		lines, err := moduleAPI(filepath.Join(root, filepath.FromSlash(m.Dir)), m.Path, gowork)
		if err != nil {
			return fmt.Errorf("module %s: %w", m.Path, err)
		}
		if len(lines) > 0 {
			want[m.apiFile()] = []byte(strings.Join(lines, "\n") + "\n")
		}
	}

	dir := filepath.Join(root, apiDir)
	have := map[string][]byte{}
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	for _, e := range entries {
		if e.Type().IsRegular() && strings.HasSuffix(e.Name(), ".txt") {
			b, err := os.ReadFile(filepath.Join(dir, e.Name()))
			if err != nil {
				return err
			}
			have[e.Name()] = b
		}
	}

	names := make([]string, 0, len(want)+len(have))
	for n := range want {
		names = append(names, n)
	}
	for n := range have {
		if _, ok := want[n]; !ok {
			names = append(names, n)
		}
	}
	slices.Sort(names)

	changed := false
	for _, n := range names {
		w, inWant := want[n]
		h, inHave := have[n]
		if inWant && inHave && bytes.Equal(w, h) {
			continue
		}
		changed = true
		file := filepath.Join(dir, n)
		rel := apiDir + "/" + n
		if write {
			if !inWant {
				fmt.Printf("apicheck: removing %s (no module has that API any more)\n", rel)
				if err := os.Remove(file); err != nil {
					return err
				}
				continue
			}
			fmt.Printf("apicheck: writing %s\n", rel)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
			if err := os.WriteFile(file, w, 0o644); err != nil {
				return err
			}
			continue
		}
		from, to := "a/"+rel, "b/"+rel
		if !inHave {
			from = "/dev/null"
		}
		if !inWant {
			to = "/dev/null"
		}
		if d := unifiedDiff(from, to, splitLines(h), splitLines(w), 1); d != "" {
			fmt.Print(d)
		} else {
			fmt.Printf("%s: same lines, other bytes (line endings, final newline)\n", rel)
		}
	}
	if changed && !write {
		return errChanged
	}
	return nil
}

// findRoot returns the nearest directory up from the working directory that
// holds a go.work or a .git.
func findRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		for _, marker := range []string{"go.work", ".git"} {
			if _, err := os.Stat(filepath.Join(dir, marker)); err == nil {
				return dir, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.work or .git above the working directory: pass -root")
		}
		dir = parent
	}
}

type module struct {
	Dir  string // relative to the root, slash-separated; "." for the root
	Path string // module path
}

// apiFile is the module's file name in api/.
func (m module) apiFile() string {
	if m.Dir == "." {
		return path.Base(m.Path) + ".txt"
	}
	return strings.ReplaceAll(m.Dir, "/", "-") + ".txt"
}

// publishedModules finds the go.mod files under root, less the excluded
// ones, sorted by directory.
func publishedModules(root string) ([]module, error) {
	var mods []module
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			name := d.Name()
			if rel != "." && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || slices.Contains(skippedDirNames, name)) {
				return filepath.SkipDir
			}
			if slices.Contains(excludedModuleDirs, rel) {
				return filepath.SkipDir
			}
			return nil
		}
		if d.Name() != "go.mod" {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		modPath := modfile.ModulePath(data)
		if modPath == "" {
			return fmt.Errorf("%s: no module line", p)
		}
		mods = append(mods, module{Dir: path.Dir(rel), Path: modPath})
		return nil
	})
	slices.SortFunc(mods, func(a, b module) int { return strings.Compare(a.Dir, b.Dir) })
	return mods, err
}

// workspaceDirs returns the module directories (relative to root,
// slash-separated, cleaned) that root/go.work uses; none without a go.work.
func workspaceDirs(root string) (map[string]bool, error) {
	file := filepath.Join(root, "go.work")
	data, err := os.ReadFile(file)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]bool{}, nil
	}
	if err != nil {
		return nil, err
	}
	wf, err := modfile.ParseWork(file, data, nil)
	if err != nil {
		return nil, err
	}
	dirs := map[string]bool{}
	for _, u := range wf.Use {
		dirs[path.Clean(filepath.ToSlash(u.Path))] = true
	}
	return dirs, nil
}

// moduleAPI loads the module's packages in dir (./...) and returns the API
// lines of its published ones, sorted. gowork is the GOWORK to load with.
func moduleAPI(dir, modPath, gowork string) ([]string, error) {
	cfg := &packages.Config{
		Mode: packages.NeedName | packages.NeedModule | packages.NeedTypes | packages.NeedSyntax | packages.NeedTypesInfo,
		Dir:  dir,
		Env:  append(os.Environ(), "GOWORK="+gowork, "GOOS=linux", "GOARCH=amd64"),
	}
	pkgs, err := packages.Load(cfg, "./...")
	if err != nil {
		return nil, err
	}
	var lines []string
	var errs []string
	for _, p := range pkgs {
		if p.Module == nil || p.Module.Path != modPath || p.Name == "main" || isInternal(p.PkgPath) {
			continue
		}
		for _, e := range p.Errors {
			errs = append(errs, e.Error())
		}
		if len(p.Errors) == 0 {
			lines = append(lines, apiLines(p.Types, p.Syntax)...)
		}
	}
	if len(errs) > 0 {
		return nil, errors.New(strings.Join(errs, "\n"))
	}
	slices.Sort(lines)
	return slices.Compact(lines), nil
}

func isInternal(pkgPath string) bool {
	return slices.Contains(strings.Split(pkgPath, "/"), "internal")
}

func splitLines(b []byte) []string {
	if len(b) == 0 {
		return nil
	}
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}
