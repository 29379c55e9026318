package airflowdeltaocc.testing;

import io.delta.storage.HDFSLogStore;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.StandardCopyOption;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;

/**
 * A LogStore that can hold one transaction just before it writes its commit file.
 *
 * A commit whose commitInfo.userMetadata carries "occ-gate:NAME" writes its lines to
 * GATE_DIR/NAME.reached and waits until GATE_DIR/NAME.release exists; every other write passes
 * straight through. The tests use it to let a second transaction commit while the first has
 * already read the table: the deterministic interleaving delta-spark's own suites use.
 */
public class GateLogStore extends HDFSLogStore {
  private static final String TOKEN = "occ-gate:";
  private static final long TIMEOUT_MS = 180_000;

  public GateLogStore(Configuration hadoopConf) {
    super(hadoopConf);
  }

  @Override
  public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration hadoopConf)
      throws IOException {
    List<String> lines = new ArrayList<>();
    actions.forEachRemaining(lines::add);
    String name = gateName(lines);
    if (name != null) {
      String dir = hadoopConf.get("occ.gate.dir", System.getProperty("java.io.tmpdir") + "/occ-gates");
      java.nio.file.Path gateDir = java.nio.file.Paths.get(dir);
      Files.createDirectories(gateDir);
      java.nio.file.Path tmp = gateDir.resolve(name + ".reached.tmp");
      Files.write(tmp, lines, StandardCharsets.UTF_8);
      Files.move(tmp, gateDir.resolve(name + ".reached"), StandardCopyOption.ATOMIC_MOVE);
      java.nio.file.Path release = gateDir.resolve(name + ".release");
      long deadline = System.currentTimeMillis() + TIMEOUT_MS;
      while (!Files.exists(release) && System.currentTimeMillis() < deadline) {
        try {
          Thread.sleep(20);
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
          throw new IOException("interrupted while held at the gate", e);
        }
      }
    }
    super.write(path, lines.iterator(), overwrite, hadoopConf);
  }

  private static String gateName(List<String> lines) {
    for (String line : lines) {
      int at = line.indexOf(TOKEN);
      if (at >= 0 && line.startsWith("{\"commitInfo\"")) {
        int start = at + TOKEN.length();
        int end = start;
        while (end < line.length() && (Character.isLetterOrDigit(line.charAt(end)) || line.charAt(end) == '-'
            || line.charAt(end) == '_')) {
          end++;
        }
        return line.substring(start, end);
      }
    }
    return null;
  }
}
