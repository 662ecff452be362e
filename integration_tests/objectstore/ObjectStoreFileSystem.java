import java.io.ByteArrayOutputStream;
import java.io.EOFException;
import java.io.File;
import java.io.FileNotFoundException;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.net.URI;
import java.net.URLDecoder;
import java.net.URLEncoder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.StandardCopyOption;
import java.util.ArrayList;
import java.util.List;
import java.util.TreeMap;
import java.util.UUID;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FSInputStream;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.util.Progressable;

/**
 * A Hadoop FileSystem with an object store's semantics, for tests: scheme {@code objstore://bucket/key}.
 *
 * Objects are flat files in one local directory ({@code fs.objstore.root}), named by their
 * encoded key: there are no real directories (a "directory" is a key prefix, or an empty marker
 * object {@code key/} that mkdirs writes, as S3A does); an object appears whole when its writer
 * closes (a PUT); rename is a copy then a delete, object by object, and is not atomic. Python's
 * open() cannot reach any of it: what a job keeps here goes through the JVM or not at all.
 */
public class ObjectStoreFileSystem extends FileSystem {
    private URI uri;
    private File root;
    private Path workingDir;

    @Override
    public String getScheme() { return "objstore"; }

    @Override
    public void initialize(URI name, Configuration conf) throws IOException {
        super.initialize(name, conf);
        uri = URI.create("objstore://" + (name.getAuthority() == null ? "" : name.getAuthority()));
        root = new File(conf.get("fs.objstore.root", System.getProperty("java.io.tmpdir") + "/objstore"));
        new File(root, ".incoming").mkdirs();
        workingDir = new Path(uri.toString() + "/");
        setConf(conf);
    }

    @Override
    public URI getUri() { return uri; }

    private String key(Path p) {
        Path q = makeQualified(p);
        String path = q.toUri().getPath();
        return q.toUri().getAuthority() + (path.startsWith("/") ? path : "/" + path);
    }

    private File object(String key) {
        return new File(root, URLEncoder.encode(key, StandardCharsets.UTF_8));
    }

    private Path pathOf(String key) {
        return new Path("objstore://" + key);
    }

    /** Every object key, sorted. */
    private List<String> keys() {
        List<String> out = new ArrayList<>();
        String[] names = root.list();
        if (names != null) {
            for (String n : names) {
                if (!n.startsWith(".")) out.add(URLDecoder.decode(n, StandardCharsets.UTF_8));
            }
        }
        out.sort(null);
        return out;
    }

    private static String dirKey(String key) { return key.endsWith("/") ? key : key + "/"; }

    private boolean isDir(String key) {
        String prefix = dirKey(key);
        for (String k : keys()) if (k.startsWith(prefix)) return true;
        return key.endsWith("/") || key.chars().filter(c -> c == '/').count() <= 1;  // the bucket itself
    }

    @Override
    public FileStatus getFileStatus(Path f) throws IOException {
        String key = key(f);
        File obj = object(key);
        if (!key.endsWith("/") && obj.isFile()) {
            return new FileStatus(obj.length(), false, 1, 1 << 20, obj.lastModified(), makeQualified(f));
        }
        if (isDir(key)) return new FileStatus(0, true, 1, 0, 0, makeQualified(f));
        throw new FileNotFoundException(f.toString());
    }

    @Override
    public FileStatus[] listStatus(Path f) throws IOException {
        FileStatus self = getFileStatus(f);
        if (!self.isDirectory()) return new FileStatus[] {self};
        String prefix = dirKey(key(f));
        TreeMap<String, FileStatus> children = new TreeMap<>();
        for (String k : keys()) {
            if (!k.startsWith(prefix) || k.equals(prefix)) continue;
            String rest = k.substring(prefix.length());
            int slash = rest.indexOf('/');
            if (slash < 0) {
                File obj = object(k);
                children.put(rest, new FileStatus(obj.length(), false, 1, 1 << 20, obj.lastModified(), pathOf(k)));
            } else {
                String child = rest.substring(0, slash);
                children.putIfAbsent(child, new FileStatus(0, true, 1, 0, 0, pathOf(prefix + child)));
            }
        }
        return children.values().toArray(new FileStatus[0]);
    }

    @Override
    public boolean mkdirs(Path f, FsPermission permission) throws IOException {
        String key = key(f);
        File obj = object(key);
        if (!key.endsWith("/") && obj.isFile()) throw new FileAlreadyExistsException(f + " is an object");
        put(new byte[0], object(dirKey(key)));
        return true;
    }

    private void put(byte[] data, File target) throws IOException {
        File tmp = new File(root, ".incoming/" + UUID.randomUUID());
        Files.write(tmp.toPath(), data);
        Files.move(tmp.toPath(), target.toPath(), StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
    }

    @Override
    public FSDataInputStream open(Path f, int bufferSize) throws IOException {
        File obj = object(key(f));
        if (!obj.isFile()) throw new FileNotFoundException(f.toString());
        return new FSDataInputStream(new Bytes(Files.readAllBytes(obj.toPath())));
    }

    @Override
    public FSDataOutputStream create(Path f, FsPermission permission, boolean overwrite, int bufferSize,
                                     short replication, long blockSize, Progressable progress) throws IOException {
        File target = object(key(f));
        if (!overwrite && target.exists()) throw new FileAlreadyExistsException(f.toString());
        File tmp = new File(root, ".incoming/" + UUID.randomUUID());
        OutputStream upload = new FileOutputStream(tmp) {
            private boolean closed;

            @Override
            public void close() throws IOException {  // the PUT: the object appears whole, now
                if (closed) return;
                closed = true;
                super.close();
                Files.move(tmp.toPath(), target.toPath(), StandardCopyOption.ATOMIC_MOVE,
                           StandardCopyOption.REPLACE_EXISTING);
            }
        };
        return new FSDataOutputStream(upload, statistics);
    }

    @Override
    public FSDataOutputStream append(Path f, int bufferSize, Progressable progress) throws IOException {
        throw new IOException("objstore: objects cannot be appended to");
    }

    @Override
    public boolean rename(Path src, Path dst) throws IOException {
        String from = key(src), to = key(dst);
        File obj = object(from);
        if (obj.isFile()) {  // copy, then delete: two steps, not atomic
            if (object(to).exists()) return false;
            put(Files.readAllBytes(obj.toPath()), object(to));
            return obj.delete();
        }
        String prefix = dirKey(from);
        boolean moved = false;
        for (String k : keys()) {
            if (k.startsWith(prefix)) {
                File o = object(k);
                put(Files.readAllBytes(o.toPath()), object(dirKey(to) + k.substring(prefix.length())));
                o.delete();
                moved = true;
            }
        }
        return moved;
    }

    @Override
    public boolean delete(Path f, boolean recursive) throws IOException {
        String key = key(f);
        File obj = object(key);
        if (!key.endsWith("/") && obj.isFile()) return obj.delete();
        String prefix = dirKey(key);
        List<String> under = new ArrayList<>();
        for (String k : keys()) if (k.startsWith(prefix)) under.add(k);
        if (!recursive && under.size() > 1) throw new IOException("objstore: " + f + " is not empty");
        for (String k : under) object(k).delete();
        return !under.isEmpty();
    }

    @Override
    public void setWorkingDirectory(Path dir) { workingDir = dir; }

    @Override
    public Path getWorkingDirectory() { return workingDir; }

    /** An object's bytes, seekable. */
    static final class Bytes extends FSInputStream {
        private final byte[] data;
        private int pos;

        Bytes(byte[] data) { this.data = data; }

        @Override
        public void seek(long to) throws IOException {
            if (to < 0 || to > data.length) throw new EOFException("seek to " + to + " of " + data.length);
            pos = (int) to;
        }

        @Override
        public long getPos() { return pos; }

        @Override
        public boolean seekToNewSource(long targetPos) { return false; }

        @Override
        public int read() { return pos < data.length ? data[pos++] & 0xFF : -1; }

        @Override
        public int read(byte[] b, int off, int len) {
            if (pos >= data.length) return -1;
            int n = Math.min(len, data.length - pos);
            System.arraycopy(data, pos, b, off, n);
            pos += n;
            return n;
        }

        @Override
        public int available() { return data.length - pos; }
    }
}
