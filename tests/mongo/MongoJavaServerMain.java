// Starts mongo-java-server (in-memory backend, oplog enabled so change streams work) on
// 127.0.0.1:<port> for the MongoDB tests; prints "READY <port>" and serves until killed.
// It announces wire version 13 (MongoDB 5.0): its own enum tops out at 8, below what pymongo 4.20
// accepts (9). That is a label only; what the server models is listed in docs/mongodb.md.
import de.bwaldvogel.mongo.MongoServer;
import de.bwaldvogel.mongo.MongoVersion;
import de.bwaldvogel.mongo.backend.memory.MemoryBackend;
import java.util.List;

public final class MongoJavaServerMain {
    public static void main(String[] args) throws Exception {
        MongoVersion announced = new MongoVersion() {
            public List<Integer> getVersionArray() { return List.of(5, 0, 0); }
            public int getWireVersion() { return 13; }
        };
        MongoServer server = new MongoServer(new MemoryBackend().version(announced));
        server.enableOplog();
        server.bind("127.0.0.1", Integer.parseInt(args[0]));
        Runtime.getRuntime().addShutdownHook(new Thread(server::shutdownNow));
        System.out.println("READY " + args[0]);
        System.out.flush();
        Thread.currentThread().join();
    }
}
