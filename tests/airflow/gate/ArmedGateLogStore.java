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
 * A LogStore that holds one chosen commit just before it writes its commit file, armed from outside.
 *
 * The gate directory is the Hadoop conf "occ.armed.dir" (spark.hadoop.occ.armed.dir). A file
 * NAME.arm there holds a token; the next commit whose commitInfo line contains the token claims it
 * (NAME.arm is renamed to NAME.held, so one arm holds exactly one commit), writes NAME.reached and
 * waits until NAME.release exists; then the commit file is written as usual and delta-spark's own
 * conflict check decides what happens. Commits that match no arm pass straight through. The tests
 * of tests/airflow arm it from inside an Airflow task to make a concurrent writer commit while the
 * task's Spark job is between reading the table and committing: a real, deterministic conflict.
 */
public class ArmedGateLogStore extends HDFSLogStore {
  private static final long TIMEOUT_MS = 180_000;

  public ArmedGateLogStore(Configuration hadoopConf) {
    super(hadoopConf);
  }

  @Override
  public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration hadoopConf)
      throws IOException {
    List<String> lines = new ArrayList<>();
    actions.forEachRemaining(lines::add);
    String dir = hadoopConf.get("occ.armed.dir");
    String info = null;
    for (String line : lines) {
      if (line.startsWith("{\"commitInfo\"")) {
        info = line;
        break;
      }
    }
    if (dir != null && info != null && Files.isDirectory(Paths.get(dir))) {
      java.nio.file.Path gateDir = Paths.get(dir);
      String claimed = null;
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
          claimed = name;
          break;
        }
      }
      if (claimed != null) {
        hold(gateDir, claimed, lines);
      }
    }
    super.write(path, lines.iterator(), overwrite, hadoopConf);
  }

  private static void hold(java.nio.file.Path gateDir, String name, List<String> lines) throws IOException {
    java.nio.file.Path tmp = gateDir.resolve(name + ".reached.tmp");
    Files.write(tmp, lines, StandardCharsets.UTF_8);
    Files.move(tmp, gateDir.resolve(name + ".reached"), StandardCopyOption.ATOMIC_MOVE);
    java.nio.file.Path release = gateDir.resolve(name + ".release");
    long deadline = System.currentTimeMillis() + TIMEOUT_MS;
    while (!Files.exists(release)) {
      if (System.currentTimeMillis() > deadline) {
        throw new IOException("commit held at gate " + name + " was never released");
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
