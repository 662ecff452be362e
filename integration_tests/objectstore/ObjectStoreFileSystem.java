import java.io.ByteArrayOutputStream;
import java.io.EOFException;
import java.io.File;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.HttpURLConnection;
import java.net.URI;
import java.net.URL;
import java.net.URLDecoder;
import java.net.URLEncoder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.StandardCopyOption;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
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
 * There are no real directories (a "directory" is a key prefix, or an empty marker object
 * {@code key/} that mkdirs writes, as S3A does); an object appears whole when its writer closes
 * (a PUT); rename is a copy then a delete, object by object, and is not atomic. Python's open()
 * cannot reach any of it: what a job keeps here goes through the JVM or not at all.
 *
 * Where the objects are ({@code fs.objstore.root}): a local directory (flat files named by their
 * encoded key), or {@code http://host:port} — the store of objectstore_server.py, reached over
 * the network by the driver and every executor alike, so a cluster shares no disk.
 */
public class ObjectStoreFileSystem extends FileSystem {
    private URI uri;
    private Store store;
    private Path workingDir;

    /** The objects: flat keys, whole values. */
    interface Store {
        /** Every key starting with {@code prefix}, sorted, with its size and modification time. */
        TreeMap<String, long[]> list(String prefix) throws IOException;
        /** Size and modification time, or null when there is no such object. */
        long[] stat(String key) throws IOException;
        /** The object's bytes, or null. */
        byte[] get(String key) throws IOException;
        void put(String key, byte[] data) throws IOException;
        boolean delete(String key) throws IOException;
    }

    /** Objects as files of one local directory; a PUT is a write then an atomic move. */
    static final class LocalStore implements Store {
        private final File root;

        LocalStore(File root) {
            this.root = root;
            new File(root, ".incoming").mkdirs();
        }

        private File object(String key) { return new File(root, URLEncoder.encode(key, StandardCharsets.UTF_8)); }

        public TreeMap<String, long[]> list(String prefix) {
            TreeMap<String, long[]> out = new TreeMap<>();
            String[] names = root.list();
            if (names == null) return out;
            for (String n : names) {
                if (n.startsWith(".")) continue;
                String key = URLDecoder.decode(n, StandardCharsets.UTF_8);
                if (key.startsWith(prefix)) {
                    File f = new File(root, n);
                    out.put(key, new long[] {f.length(), f.lastModified()});
                }
            }
            return out;
        }

        public long[] stat(String key) {
            File f = object(key);
            return f.isFile() ? new long[] {f.length(), f.lastModified()} : null;
        }

        public byte[] get(String key) throws IOException {
            File f = object(key);
            return f.isFile() ? Files.readAllBytes(f.toPath()) : null;
        }

        public void put(String key, byte[] data) throws IOException {
            File tmp = new File(root, ".incoming/" + UUID.randomUUID());
            Files.write(tmp.toPath(), data);
            Files.move(tmp.toPath(), object(key).toPath(), StandardCopyOption.ATOMIC_MOVE,
                       StandardCopyOption.REPLACE_EXISTING);
        }

        public boolean delete(String key) { return object(key).delete(); }
    }

    /** Objects in objectstore_server.py, over HTTP: GET/PUT/DELETE /o/KEY, GET /list?prefix=P, GET /stat/KEY. */
    static final class HttpStore implements Store {
        private final String base;

        HttpStore(String base) { this.base = base.endsWith("/") ? base.substring(0, base.length() - 1) : base; }

        private static String enc(String s) { return URLEncoder.encode(s, StandardCharsets.UTF_8); }

        private byte[] call(String method, String path, byte[] body) throws IOException {
            HttpURLConnection c = (HttpURLConnection) new URL(base + path).openConnection();
            c.setRequestMethod(method);
            c.setConnectTimeout(10_000);
            c.setReadTimeout(60_000);
            if (body != null) {
                c.setDoOutput(true);
                c.setFixedLengthStreamingMode(body.length);
                try (OutputStream out = c.getOutputStream()) { out.write(body); }
            }
            int code = c.getResponseCode();
            if (code == 404) {
                InputStream error = c.getErrorStream();  // read to its end: the connection is kept
                if (error != null) error.readAllBytes();
                return null;
            }
            if (code != 200) throw new IOException("objstore: " + method + " " + path + ": HTTP " + code);
            try (InputStream in = c.getInputStream()) { return in.readAllBytes(); }
        }

        public TreeMap<String, long[]> list(String prefix) throws IOException {
            TreeMap<String, long[]> out = new TreeMap<>();
            String text = new String(call("GET", "/list?prefix=" + enc(prefix), null), StandardCharsets.UTF_8);
            for (String line : text.split("\n")) {
                if (line.isEmpty()) continue;
                String[] f = line.split("\t");
                out.put(URLDecoder.decode(f[0], StandardCharsets.UTF_8), new long[] {Long.parseLong(f[1]), Long.parseLong(f[2])});
            }
            return out;
        }

        public long[] stat(String key) throws IOException {
            byte[] got = call("GET", "/stat/" + enc(key), null);
            if (got == null) return null;
            String[] f = new String(got, StandardCharsets.UTF_8).trim().split("\t");
            return new long[] {Long.parseLong(f[0]), Long.parseLong(f[1])};
        }

        public byte[] get(String key) throws IOException { return call("GET", "/o/" + enc(key), null); }

        public void put(String key, byte[] data) throws IOException { call("PUT", "/o/" + enc(key), data); }

        public boolean delete(String key) throws IOException { return call("DELETE", "/o/" + enc(key), null) != null; }
    }

    @Override
    public String getScheme() { return "objstore"; }

    @Override
    public void initialize(URI name, Configuration conf) throws IOException {
        super.initialize(name, conf);
        uri = URI.create("objstore://" + (name.getAuthority() == null ? "" : name.getAuthority()));
        String root = conf.get("fs.objstore.root", System.getProperty("java.io.tmpdir") + "/objstore");
        store = root.startsWith("http://") ? new HttpStore(root) : new LocalStore(new File(root));
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

    private Path pathOf(String key) {
        return new Path("objstore://" + key);
    }

    private static String dirKey(String key) { return key.endsWith("/") ? key : key + "/"; }

    private boolean isDir(String key) throws IOException {
        if (!store.list(dirKey(key)).isEmpty()) return true;
        return key.endsWith("/") || key.chars().filter(c -> c == '/').count() <= 1;  // the bucket itself
    }

    @Override
    public FileStatus getFileStatus(Path f) throws IOException {
        String key = key(f);
        long[] stat = key.endsWith("/") ? null : store.stat(key);
        if (stat != null) return new FileStatus(stat[0], false, 1, 1 << 20, stat[1], makeQualified(f));
        if (isDir(key)) return new FileStatus(0, true, 1, 0, 0, makeQualified(f));
        throw new FileNotFoundException(f.toString());
    }

    @Override
    public FileStatus[] listStatus(Path f) throws IOException {
        FileStatus self = getFileStatus(f);
        if (!self.isDirectory()) return new FileStatus[] {self};
        String prefix = dirKey(key(f));
        TreeMap<String, FileStatus> children = new TreeMap<>();
        for (Map.Entry<String, long[]> e : store.list(prefix).entrySet()) {
            String k = e.getKey();
            if (k.equals(prefix)) continue;
            String rest = k.substring(prefix.length());
            int slash = rest.indexOf('/');
            if (slash < 0) {
                children.put(rest, new FileStatus(e.getValue()[0], false, 1, 1 << 20, e.getValue()[1], pathOf(k)));
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
        if (!key.endsWith("/") && store.stat(key) != null) throw new FileAlreadyExistsException(f + " is an object");
        store.put(dirKey(key), new byte[0]);
        return true;
    }

    @Override
    public FSDataInputStream open(Path f, int bufferSize) throws IOException {
        byte[] data = store.get(key(f));
        if (data == null) throw new FileNotFoundException(f.toString());
        return new FSDataInputStream(new Bytes(data));
    }

    @Override
    public FSDataOutputStream create(Path f, FsPermission permission, boolean overwrite, int bufferSize,
                                     short replication, long blockSize, Progressable progress) throws IOException {
        String key = key(f);
        if (!overwrite && store.stat(key) != null) throw new FileAlreadyExistsException(f.toString());
        OutputStream upload = new ByteArrayOutputStream() {
            private boolean closed;

            @Override
            public void close() throws IOException {  // the PUT: the object appears whole, now
                if (closed) return;
                closed = true;
                store.put(key, toByteArray());
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
        byte[] data = from.endsWith("/") ? null : store.get(from);
        if (data != null) {  // copy, then delete: two steps, not atomic
            if (store.stat(to) != null) return false;
            store.put(to, data);
            return store.delete(from);
        }
        String prefix = dirKey(from);
        boolean moved = false;
        for (String k : store.list(prefix).keySet()) {
            byte[] o = store.get(k);
            if (o == null) continue;
            store.put(dirKey(to) + k.substring(prefix.length()), o);
            store.delete(k);
            moved = true;
        }
        return moved;
    }

    @Override
    public boolean delete(Path f, boolean recursive) throws IOException {
        String key = key(f);
        if (!key.endsWith("/") && store.stat(key) != null) return store.delete(key);
        List<String> under = new ArrayList<>(store.list(dirKey(key)).keySet());
        if (!recursive && under.size() > 1) throw new IOException("objstore: " + f + " is not empty");
        for (String k : under) store.delete(k);
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
