// Command publish writes modules of the working tree, as a given version, into
// a file-system module proxy (the layout GOPROXY=file://<dir> reads), so that
// a release can be tried the way users will get it before anything is
// tagged. .ci/release-check runs it.
//
// Usage:
//
//	publish -proxy DIR -version vX.Y.Z MODULE_DIR...
//
// Each MODULE_DIR holds a go.mod. Its files are those git tracks or would
// track (untracked files that .gitignore does not exclude), as in the working
// tree; outside of a git repository, every file of the directory. Files of
// nested modules are left out, as the go command leaves them out. A module
// whose go.mod has a replace directive is refused: the go command ignores
// replace directives of every module but the main one, so a published module
// must build without them.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	modzip "golang.org/x/mod/zip"
)

func main() {
	proxy := flag.String("proxy", "", "the proxy directory to write into (created if missing)")
	version := flag.String("version", "v0.1.0", "the version to publish the modules as")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: publish -proxy DIR [-version vX.Y.Z] MODULE_DIR...")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *proxy == "" || flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	if !semver.IsValid(*version) || semver.Canonical(*version) != *version {
		fmt.Fprintf(os.Stderr, "publish: %q is not a canonical semantic version (vX.Y.Z)\n", *version)
		os.Exit(2)
	}
	failed := false
	for _, dir := range flag.Args() {
		if err := publish(*proxy, *version, dir); err != nil {
			fmt.Fprintf(os.Stderr, "publish: %s: %v\n", dir, err)
			failed = true
		}
	}
	if failed {
		os.Exit(1)
	}
}

func publish(proxy, version, dir string) error {
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return err
	}
	mf, err := modfile.Parse(filepath.Join(dir, "go.mod"), gomod, nil)
	if err != nil {
		return err
	}
	if mf.Module == nil {
		return fmt.Errorf("go.mod has no module directive")
	}
	if len(mf.Replace) > 0 {
		var rs []string
		for _, r := range mf.Replace {
			rs = append(rs, r.Old.Path+" => "+r.New.Path)
		}
		return fmt.Errorf("go.mod has replace directives (%s): users' builds ignore them, so a published module must not need them", strings.Join(rs, "; "))
	}
	m := module.Version{Path: mf.Module.Mod.Path, Version: version}
	if err := module.Check(m.Path, m.Version); err != nil {
		return err
	}
	files, err := listFiles(dir)
	if err != nil {
		return err
	}
	checked, err := modzip.CheckFiles(files)
	if err != nil {
		return err
	}
	var zip bytes.Buffer
	if err := modzip.Create(&zip, m, files); err != nil {
		return err
	}
	esc, err := module.EscapePath(m.Path)
	if err != nil {
		return err
	}
	vdir := filepath.Join(proxy, filepath.FromSlash(esc), "@v")
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		return err
	}
	info, _ := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, time.Now().UTC().Truncate(time.Second)})
	for name, data := range map[string][]byte{version + ".info": info, version + ".mod": gomod, version + ".zip": zip.Bytes()} {
		if err := os.WriteFile(filepath.Join(vdir, name), data, 0o644); err != nil {
			return err
		}
	}
	if err := addToList(filepath.Join(vdir, "list"), version); err != nil {
		return err
	}
	fmt.Printf("published %s@%s (%d files, %d bytes zipped)\n", m.Path, m.Version, len(checked.Valid), zip.Len())
	return nil
}

// addToList adds version to a proxy's list of versions of a module.
func addToList(list, version string) error {
	b, err := os.ReadFile(list)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	versions := strings.Fields(string(b))
	if !slices.Contains(versions, version) {
		versions = append(versions, version)
	}
	semver.Sort(versions)
	return os.WriteFile(list, []byte(strings.Join(versions, "\n")+"\n"), 0o644)
}

// listFiles lists the module's files as git sees the working tree: tracked
// files that still exist, and untracked files .gitignore does not exclude.
// Outside of a git work tree, every regular file of dir.
func listFiles(dir string) ([]modzip.File, error) {
	out, err := exec.Command("git", "-C", dir, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		var files []modzip.File
		err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && d.Name() == ".git" {
				return filepath.SkipDir
			}
			if !d.Type().IsRegular() {
				return nil
			}
			rel, err := filepath.Rel(dir, p)
			if err != nil {
				return err
			}
			files = append(files, file{dir: dir, rel: filepath.ToSlash(rel)})
			return nil
		})
		return files, err
	}
	var files []modzip.File
	seen := map[string]bool{}
	for _, rel := range strings.Split(string(out), "\x00") {
		if rel == "" || seen[rel] {
			continue
		}
		seen[rel] = true
		if fi, err := os.Lstat(filepath.Join(dir, filepath.FromSlash(rel))); err != nil || !fi.Mode().IsRegular() {
			continue // deleted in the working tree, or not a regular file
		}
		files = append(files, file{dir: dir, rel: rel})
	}
	return files, nil
}

// file is a file of the module directory, by its slash-separated path
// relative to it.
type file struct{ dir, rel string }

func (f file) Path() string { return f.rel }

func (f file) Lstat() (os.FileInfo, error) {
	return os.Lstat(filepath.Join(f.dir, filepath.FromSlash(f.rel)))
}

func (f file) Open() (io.ReadCloser, error) {
	return os.Open(filepath.Join(f.dir, filepath.FromSlash(f.rel)))
}
