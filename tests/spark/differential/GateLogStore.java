package airflowdeltaocc.testing;

import io.delta.storage.HDFSLogStore;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;

/**
 * A LogStore that can hold one transaction just before it writes its commit file.
 *
 * Two triggers choose the commit to hold; every other write passes straight through.
 *
 * 1. The token: a commit whose commitInfo.userMetadata carries "occ-gate:NAME" is held in the
 *    directory of the Hadoop conf "occ.gate.dir" (default TMPDIR/occ-gates, created if missing).
 *    If it is not released in time it is written anyway. The spark tier (harness.py) sets the token
 *    on transaction A's own SparkSession.
 * 2. The arm: when the Hadoop conf "occ.armed.dir" (spark.hadoop.occ.armed.dir) names an existing
 *    directory, a file NAME.arm there holds a token; the next commit whose commitInfo line contains
 *    the token claims it (NAME.arm is renamed to NAME.held, so one arm holds exactly one commit) and
 *    is held in that directory. If it is not released in time the write fails. The tests of
 *    tests/airflow arm it from inside an Airflow task, to make a concurrent writer commit while the
 *    task's Spark job is between reading the table and committing. A commit carrying an
 *    "occ-gate:" token is held by its token only and claims no arm.
 *
 * Held at NAME, a commit writes its lines to NAME.reached (atomically) and waits until NAME.release
 * exists; then the commit file is written as usual and delta-spark's own conflict check decides
 * what happens: the deterministic interleaving delta-spark's own suites use.
 */
public class GateLogStore extends HDFSLogStore {
  private static final String TOKEN = "occ-gate:";
  private static final String COMMIT_INFO = "{\"commitInfo\"";
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
      java.nio.file.Path gateDir = Paths.get(dir);
      Files.createDirectories(gateDir);
      hold(gateDir, name, lines, false);
    } else {
      String armedDir = hadoopConf.get("occ.armed.dir");
      if (armedDir != null) {
        java.nio.file.Path gateDir = Paths.get(armedDir);
        String claimed = claimArm(gateDir, lines);
        if (claimed != null) {
          hold(gateDir, claimed, lines, true);
        }
      }
    }
    super.write(path, lines.iterator(), overwrite, hadoopConf);
  }

  /** The NAME of the first commitInfo line carrying "occ-gate:NAME", or null. */
  private static String gateName(List<String> lines) {
    for (String line : lines) {
      int at = line.indexOf(TOKEN);
      if (at >= 0 && line.startsWith(COMMIT_INFO)) {
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

  /** The NAME of the arm in gateDir whose token the commit's commitInfo line contains, claimed; or null. */
  private static String claimArm(java.nio.file.Path gateDir, List<String> lines) throws IOException {
    String info = null;
    for (String line : lines) {
      if (line.startsWith(COMMIT_INFO)) {
        info = line;
        break;
      }
    }
    if (info == null || !Files.isDirectory(gateDir)) {
      return null;
    }
    try (DirectoryStream<java.nio.file.Path> arms = Files.newDirectoryStream(gateDir, "*.arm")) {
      for (java.nio.file.Path arm : arms) {
        String token;
        try {
          token = new String(Files.readAllBytes(arm), StandardCharsets.UTF_8).trim();
        } catch (NoSuchFileException e) {
          continue;
        }
        if (token.isEmpty() || !info.contains(token)) {
          continue;
        }
        String file = arm.getFileName().toString();
        String name = file.substring(0, file.length() - ".arm".length());
        try {
          Files.move(arm, gateDir.resolve(name + ".held"), StandardCopyOption.ATOMIC_MOVE);
        } catch (NoSuchFileException e) {
          continue;  // another commit claimed it first
        }
        return name;
      }
    }
    return null;
  }

  /**
   * Publishes the lines as NAME.reached and waits for NAME.release. After TIMEOUT_MS the commit
   * goes on (failOnTimeout false) or the write fails (failOnTimeout true).
   */
  private static void hold(java.nio.file.Path gateDir, String name, List<String> lines, boolean failOnTimeout)
      throws IOException {
    java.nio.file.Path tmp = gateDir.resolve(name + ".reached.tmp");
    Files.write(tmp, lines, StandardCharsets.UTF_8);
    Files.move(tmp, gateDir.resolve(name + ".reached"), StandardCopyOption.ATOMIC_MOVE);
    java.nio.file.Path release = gateDir.resolve(name + ".release");
    long deadline = System.currentTimeMillis() + TIMEOUT_MS;
    while (!Files.exists(release)) {
      if (System.currentTimeMillis() > deadline) {
        if (failOnTimeout) {
          throw new IOException("commit held at gate " + name + " was never released");
        }
        return;
      }
      try {
        Thread.sleep(20);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new IOException("interrupted while held at gate " + name, e);
      }
    }
  }
}
