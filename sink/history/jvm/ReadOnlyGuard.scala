// The history job's SQL guard (sink/history/guard.py): a Spark session extension whose check
// rule lets a session that is not the job's own only read catalog tables. Sessions opened by
// the JDBC/ODBC endpoint (Spark's Thrift server) and by Spark Connect clients are new sessions
// of the job's SparkContext; the job marks its own session with a random value (its clones,
// such as the streaming query's, copy it) that no client can know, so every other session is
// guarded, whatever it set. Refused in a guarded session: every command but USE, SHOW and
// DESCRIBE (writes, DDL, SET, ADD JAR, INSERT OVERWRITE DIRECTORY, CACHE...), every relation
// that is not a catalog table (file paths: text.`/path`, spark.read of a path, data sources by
// name, streams), user code (Python/Scala UDFs, typed Dataset closures, TRANSFORM scripts) and
// reflect/java_method.
// Compiled with the Scala compiler inside pyspark (sink/history/guard.py).
package mqtthistory

import java.security.{MessageDigest, SecureRandom}

import org.apache.spark.sql.{SparkSession, SparkSessionExtensions}
import org.apache.spark.sql.catalyst.catalog.HiveTableRelation
import org.apache.spark.sql.catalyst.expressions.{Expression, UserDefinedExpression}
import org.apache.spark.sql.catalyst.plans.logical._
import org.apache.spark.sql.execution.datasources.LogicalRelation

object ReadOnlyGuard {
  val TrustKey = "spark.mqtthistory.trusted"
  val Marker = "read-only session"

  private val nonce: String = {
    val b = new Array[Byte](32)
    new SecureRandom().nextBytes(b)
    b.map(x => f"${x & 0xff}%02x").mkString
  }

  /** Mark the job's own session: it and its clones are not guarded. */
  def trust(session: SparkSession): Unit = session.conf.set(TrustKey, nonce)

  def trusted(session: SparkSession): Boolean = {
    val v = try session.conf.get(TrustKey, "") catch { case _: Throwable => "" }
    MessageDigest.isEqual(v.getBytes("UTF-8"), nonce.getBytes("UTF-8"))
  }

  /** Commands a reader may run: they show the catalog, or change the session's current
   *  database; nothing under them is read or checked further. */
  val AllowedCommands: Set[String] = Set(
    "SetCatalogAndNamespace", "SetNamespaceCommand", "ShowTables", "ShowTablesCommand",
    "ShowTablesExtended", "ShowNamespaces", "ShowNamespacesCommand", "ShowColumns",
    "ShowColumnsCommand", "DescribeRelation", "DescribeTableCommand", "DescribeColumn",
    "DescribeColumnCommand", "DescribeNamespace", "DescribeDatabaseCommand",
    "ShowCurrentNamespaceCommand", "ShowCatalogsCommand", "ShowCreateTable",
    "ShowCreateTableCommand", "ShowTableProperties", "ShowTablePropertiesCommand",
    "ShowFunctions", "ShowFunctionsCommand", "DescribeFunction", "DescribeFunctionCommand",
    "ShowPartitions", "ShowPartitionsCommand", "ShowViews", "ShowViewsCommand")

  private def refuse(what: String): Nothing =
    throw new SecurityException(s"$Marker: $what is not allowed here: only queries (SELECT) " +
      "over the catalog's tables, and SHOW/DESCRIBE/USE")

  private def checkExpression(e: Expression): Unit = e.foreach {
    case u: UserDefinedExpression => refuse(s"a user-defined function (${u.getClass.getSimpleName})")
    case x if x.getClass.getSimpleName.contains("Reflect") => refuse("reflect/java_method")
    case x if x.getClass.getSimpleName.startsWith("Python") => refuse("Python code")
    case _ =>
  }

  def check(plan: LogicalPlan): Unit = {
    plan match {
      case c: Command if AllowedCommands.contains(c.getClass.getSimpleName) => return
      case c: Command => refuse(s"the command ${c.getClass.getSimpleName}")
      case r: LogicalRelation if r.catalogTable.isDefined =>
      case _: HiveTableRelation | _: LocalRelation | _: OneRowRelation | _: Range =>
      case _: CommandResult =>   // the rows of a command run before (checked when it ran)
      // rows to and from JVM objects (Spark's own, e.g. Dataset.rdd: the Thrift server's
      // results) are allowed; typed operations running client code (map, filter,
      // mapPartitions, groupByKey...) are not
      case _: DeserializeToObject | _: SerializeFromObject =>
      case _: ObjectConsumer | _: ObjectProducer => refuse("Dataset code")
      case s if s.getClass.getSimpleName.contains("ScriptTransformation") =>
        refuse("TRANSFORM (a program run by the server)")
      case leaf: LeafNode => refuse(s"reading ${leaf.getClass.getSimpleName} (not a catalog table)")
      case _ =>
    }
    plan.expressions.foreach(checkExpression)
    plan.children.foreach(check)
    plan.subqueries.foreach(check)
  }
}

/** spark.sql.extensions=mqtthistory.ReadOnlyGuardExtension */
class ReadOnlyGuardExtension extends (SparkSessionExtensions => Unit) {
  override def apply(ext: SparkSessionExtensions): Unit =
    ext.injectCheckRule { session => plan =>
      if (!ReadOnlyGuard.trusted(session)) ReadOnlyGuard.check(plan)
    }
}
